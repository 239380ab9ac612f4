#!/bin/sh
# Installs this bundle's kvembed server into a venv from the wheelhouse beside this script:
# no package index, no network (pip --no-index; every wheel pinned by sha256).
# Target: @@PLATFORM@@, CPython @@PYTHON@@. Usage: ./install.sh   (PYTHON=/path/to/python@@PYTHON@@, KVEMBED_VENV=DIR to change)
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${KVEMBED_VENV:-$HERE/venv}

if [ -z "${PYTHON:-}" ]; then
    if command -v python@@PYTHON@@ >/dev/null 2>&1; then PYTHON=python@@PYTHON@@; else PYTHON=python3; fi
fi
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "install.sh: no $PYTHON here: this bundle's wheels are for CPython @@PYTHON@@ (set PYTHON=/path/to/python@@PYTHON@@)" >&2
    exit 2
fi
if ! "$PYTHON" -c 'import platform, sys; sys.exit(0 if ("%d.%d" % sys.version_info[:2], platform.machine(), platform.python_implementation()) == ("@@PYTHON@@", "@@MACHINE@@", "CPython") else 1)'; then
    echo "install.sh: $PYTHON is $("$PYTHON" -c 'import platform, sys; print(platform.python_implementation(), "%d.%d" % sys.version_info[:2], "on", platform.machine())'); this bundle is for CPython @@PYTHON@@ on @@MACHINE@@ (set PYTHON=, or build a bundle with kvembed bundle --platform/--python for this host)" >&2
    exit 2
fi

echo "install.sh: checking the files against SHA256SUMS"
(cd "$HERE" && sha256sum --quiet --strict -c SHA256SUMS)

if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PYTHON" -m venv "$VENV"; then
        echo "install.sh: $PYTHON -m venv failed (on Debian/Ubuntu: apt install python@@PYTHON@@-venv)" >&2
        exit 2
    fi
fi
"$VENV/bin/python" -m pip install --no-index --find-links "$HERE/wheelhouse" --require-hashes \
    --disable-pip-version-check --no-input -r "$HERE/wheelhouse/requirements.txt"
"$VENV/bin/kvembed" serve --help >/dev/null
# built with kvembed bundle --trust-key: every artifact must be signed by that key, checked by the
# installed kvembed (KVEMBED_TRUST_KEY=FILE: check with your own copy of the key instead of trust.pem)
SIGNED=@@SIGNED@@
if [ "$SIGNED" = yes ] || [ -n "${KVEMBED_TRUST_KEY:-}" ]; then
    KEY=${KVEMBED_TRUST_KEY:-$HERE/trust.pem}
    echo "install.sh: checking the signature of every artifact with $KEY"
    for artifact in "$HERE"/artifacts/*; do
        if ! "$VENV/bin/kvembed" embed "$artifact" "signature check" --trust-key "$KEY" >/dev/null; then
            echo "install.sh: refusing $artifact: its signature does not verify with $KEY (see the line above)" >&2
            exit 2
        fi
    done
fi
echo "install.sh: installed kvembed @@KVEMBED_VERSION@@ in $VENV; start the server with $HERE/run.sh"
