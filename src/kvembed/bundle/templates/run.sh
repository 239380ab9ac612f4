#!/bin/sh
# Starts kvembed serve on this bundle's artifacts (@@MODELS@@). Settings: kvembed.env beside this
# script (KVEMBED_HOST, KVEMBED_PORT, KVEMBED_API_KEY, KVEMBED_PROVIDER) or KVEMBED_ENV_FILE=FILE;
# more kvembed serve options after the script's name (the last --port etc. wins): ./run.sh --workers 2
# Stops on SIGTERM or Ctrl-C (requests in flight finish), exit 0.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${KVEMBED_VENV:-$HERE/venv}
ENV_FILE=${KVEMBED_ENV_FILE:-$HERE/kvembed.env}
if [ -f "$ENV_FILE" ]; then
    set -a
    # shellcheck disable=SC1090
    . "$ENV_FILE"
    set +a
fi
if [ ! -x "$VENV/bin/kvembed" ]; then
    echo "run.sh: no kvembed in $VENV: run $HERE/install.sh first" >&2
    exit 2
fi
exec "$VENV/bin/kvembed" serve @@ARTIFACTS_SH@@ \
    --host "${KVEMBED_HOST:-127.0.0.1}" --port "${KVEMBED_PORT:-8080}" --provider "${KVEMBED_PROVIDER:-auto}" "$@"
