# kvembed serve as an image: the OpenAI-compatible embeddings server on the torch-free runtime.
# Built from this checkout (BuildKit: Docker 23 or newer, or docker buildx):
#   docker build -t kvembed .
#   docker build -t kvembed --build-arg EXTRAS=serve,openvino .                 # with the OpenVINO backend
#   docker build -t kvembed-smollm2 --build-context artifacts=artifacts .     # artifacts baked in
# Run with a folder of artifacts mounted at /artifacts (each served under its folder name):
#   docker run --rm -p 8080:8080 -e KVEMBED_API_KEY -v "$PWD/artifacts:/artifacts:ro" kvembed
# docs/guides/deploy.md has the rest (Kubernetes: deploy/kubernetes/). For a host with no network,
# kvembed bundle writes a Dockerfile that installs from a wheelhouse instead.
ARG PYTHON_VERSION=3.11

# the artifacts baked into the image: none, unless the build is given a folder of artifacts as the
# named context "artifacts" (docker build --build-context artifacts=DIR), which replaces this stage
FROM scratch AS artifacts

FROM python:${PYTHON_VERSION}-slim AS build
# kvembed's extras to install: serve, plus openvino for the OpenVINO backend (never export: no torch)
ARG EXTRAS=serve
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --disable-pip-version-check --no-deps --wheel-dir /wheels . \
    && python -m venv /opt/kvembed/venv \
    && set -- /wheels/kvembed-*.whl \
    && /opt/kvembed/venv/bin/pip install --no-cache-dir --disable-pip-version-check --find-links /wheels "$1[$EXTRAS]" \
    && /opt/kvembed/venv/bin/kvembed serve --help > /dev/null

FROM python:${PYTHON_VERSION}-slim
RUN groupadd --system --gid 10001 kvembed \
    && useradd --system --uid 10001 --gid kvembed --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin kvembed
COPY --from=build /opt/kvembed/venv /opt/kvembed/venv
COPY --chmod=0755 deploy/docker/entrypoint.sh /usr/local/bin/kvembed-entrypoint
COPY --from=artifacts . /artifacts/
# KVEMBED_CACHE_DIR: kvembed's rebuildable files (compiled OpenVINO blobs); a writable place when
# the root filesystem is read-only (Kubernetes mounts an emptyDir there)
ENV PATH=/opt/kvembed/venv/bin:$PATH \
    KVEMBED_ARTIFACTS=/artifacts \
    KVEMBED_CACHE_DIR=/tmp/kvembed-cache \
    KVEMBED_HOST=0.0.0.0 \
    KVEMBED_PORT=8080 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 8080
# /health answers 200 once every artifact is loaded (503 while loading and while shutting down);
# Python's standard library, as slim images have no curl
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('KVEMBED_PORT', '8080'), timeout=4)"]
# serves every /artifacts/NAME/kvembed.json; kvembed serve options after the image name are passed on
# (docker run ... kvembed --workers 2), and any other command runs as given (docker run ... kvembed kvembed --help)
ENTRYPOINT ["kvembed-entrypoint"]
