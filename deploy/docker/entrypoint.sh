#!/bin/sh
# The kvembed image's entrypoint: kvembed serve on every artifact under $KVEMBED_ARTIFACTS
# (default /artifacts: a mounted volume, or artifacts baked into the image), each served under its
# folder name (DIR/NAME/kvembed.json -> model NAME).
#   docker run ... IMAGE                    serve every artifact
#   docker run ... IMAGE --workers 2        the same, with more kvembed serve options (the last one given wins)
#   docker run ... IMAGE kvembed embed ...  any other command, run as given
# Settings from the environment: KVEMBED_HOST (0.0.0.0), KVEMBED_PORT (8080), KVEMBED_PROVIDER (auto),
# KVEMBED_THREADS (onnxruntime threads per artifact; default one per core the process sees; in
# Kubernetes set it from the container's CPU limit), KVEMBED_API_KEY (read by kvembed serve itself).
# SIGTERM stops the server (requests in flight finish), exit 0: kvembed serve replaces this shell.
set -eu
case ${1:-} in
    "" | -*) ;;
    *) exec "$@" ;;
esac
DIR=${KVEMBED_ARTIFACTS:-/artifacts}
set -- --host "${KVEMBED_HOST:-0.0.0.0}" --port "${KVEMBED_PORT:-8080}" --provider "${KVEMBED_PROVIDER:-auto}" "$@"
if [ -n "${KVEMBED_THREADS:-}" ]; then
    set -- --threads "$KVEMBED_THREADS" "$@"
fi
set -- "$@" --
found=0
for manifest in "$DIR"/*/kvembed.json; do
    [ -f "$manifest" ] || continue
    artifact=${manifest%/kvembed.json}
    set -- "$@" "${artifact##*/}=$artifact"
    found=$((found + 1))
done
if [ "$found" -eq 0 ]; then
    echo "kvembed-entrypoint: no artifact under $DIR (no $DIR/*/kvembed.json): mount a folder of artifacts there, bake them into the image (docker build --build-context artifacts=DIR), or set KVEMBED_ARTIFACTS" >&2
    exit 2
fi
echo "kvembed-entrypoint: serving $found artifact(s) from $DIR" >&2
exec kvembed serve "$@"
