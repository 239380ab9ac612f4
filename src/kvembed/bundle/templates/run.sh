#!/bin/sh
# Starts kvembed serve on this bundle's artifacts (@@MODELS@@). Settings: kvembed.env beside this
# script (KVEMBED_HOST, KVEMBED_PORT, KVEMBED_API_KEY, KVEMBED_PROVIDER) or KVEMBED_ENV_FILE=FILE;
# a variable already in the environment wins over the file (as docker compose and python-dotenv
# do): KVEMBED_PORT=9000 ./run.sh serves on 9000. More kvembed serve options after the script's
# name (the last --port etc. wins): ./run.sh --workers 2
# Stops on SIGTERM or Ctrl-C (requests in flight finish), exit 0.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${KVEMBED_VENV:-$HERE/venv}
ENV_FILE=${KVEMBED_ENV_FILE:-$HERE/kvembed.env}
# KEY=VALUE lines taken literally (no quotes, no expansion: as systemd's EnvironmentFile= and
# docker --env-file read the same file), each only when KEY is not set in the environment
if [ -f "$ENV_FILE" ]; then
    while IFS= read -r line || [ -n "$line" ]; do
        case $line in
            [A-Za-z_]*=*) ;;
            *) continue ;;
        esac
        key=${line%%=*}
        case $key in
            *[!A-Za-z0-9_]*) continue ;;
        esac
        if eval "[ -z \"\${$key+set}\" ]"; then
            export "$key=${line#*=}"
        fi
    done < "$ENV_FILE"
fi
if [ ! -x "$VENV/bin/kvembed" ]; then
    echo "run.sh: no kvembed in $VENV: run $HERE/install.sh first" >&2
    exit 2
fi
exec "$VENV/bin/kvembed" serve @@ARTIFACTS_SH@@ \
    --host "${KVEMBED_HOST:-127.0.0.1}" --port "${KVEMBED_PORT:-8080}" --provider "${KVEMBED_PROVIDER:-auto}" "$@"
