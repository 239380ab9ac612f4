"""The image (root ``Dockerfile``, ``.dockerignore``, ``deploy/docker/entrypoint.sh``) and the
Kubernetes manifests (``deploy/kubernetes/``) that run ``kvembed serve``.

No container daemon and no cluster are available where these tests run, so the image is never
built and the manifests are never applied. What is checked instead, with the real tools: the
Dockerfile passes hadolint and copies only what ``.dockerignore`` lets into the context; every
manifest validates with kubernetes-validate in strict mode (unknown fields refused) against the
oldest and the newest Kubernetes version the suite pins; ``kubectl kustomize`` renders the
kustomization (where kubectl is installed); the probes, ports, user, writable paths and names
agree across the Dockerfile, the manifests and the routes ``kvembed serve`` really serves; and the
image's entrypoint and its ``HEALTHCHECK`` command run here, against a real server started by the
entrypoint on a folder of two real artifacts, stopped by SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from kvembed.bench.served import free_port, stop_process

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
ENTRYPOINT = ROOT / "deploy" / "docker" / "entrypoint.sh"
KUBE = ROOT / "deploy" / "kubernetes"
#: the manifests kustomization.yaml applies; secret.example.yaml is validated but never applied
APPLIED = {"deployment.yaml", "service.yaml", "hpa.yaml", "pdb.yaml", "pvc.yaml"}
#: Kubernetes versions the manifests must validate against: the oldest still widely run, and the
#: newest kubernetes-validate knows
KUBE_VERSIONS = ("1.30.0", "latest")
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not installed (the test extra brings it)")
    return found


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def healthcheck_command() -> list[str]:
    """The exec form of the Dockerfile's ``HEALTHCHECK ... CMD [...]``."""
    (check,) = [args for keyword, args in instructions() if keyword == "HEALTHCHECK"]
    return json.loads(check.split(" CMD ", 1)[1])


def docker_env() -> dict[str, str]:
    """The image's ``ENV`` settings."""
    (env,) = [args for keyword, args in instructions() if keyword == "ENV"]
    return dict(pair.split("=", 1) for pair in env.split())


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves ``path`` (relative, with /) out of the context: the last pattern that
    matches the path or a folder above it decides, ``!`` letting it back in."""
    ignored = False
    prefixes = ["/".join(path.split("/")[: i + 1]) for i in range(path.count("/") + 1)]
    for pattern in patterns:
        keep = pattern.startswith("!")
        regex = re.escape(pattern.lstrip("!").strip("/")).replace(r"\*\*", ".*").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, prefix) for prefix in prefixes):
            ignored = not keep
    return ignored


def manifests() -> dict[str, dict]:
    """Every manifest file's one resource, by file name."""
    return {p.name: yaml.safe_load(p.read_text(encoding="utf-8")) for p in sorted(KUBE.glob("*.yaml"))}


def served_routes() -> set[tuple[str, str]]:
    """(method, path) of every route of kvembed serve's app, as tests/test_docs.py reads them."""
    from kvembed.serve import ServeConfig, create_app

    app = create_app(ServeConfig(artifacts=(("m", ROOT / "no-such-artifact"),)))
    return {(method, route.path) for route in app.routes for method in getattr(route, "methods", None) or ()}


def test_the_dockerfile_passes_hadolint_and_builds_a_slim_non_root_image() -> None:
    done = subprocess.run([tool("hadolint"), "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = instructions()
    stages = [args for keyword, args in steps if keyword == "FROM"]
    assert stages[-1].startswith("python:") and "-slim" in stages[-1], "the runtime stage is a slim Python image"
    assert any(" AS build" in stage for stage in stages), "a build stage"
    build = " ".join(args for keyword, args in steps if keyword == "RUN")
    assert "pip wheel" in build and "--no-deps" in build and "[$EXTRAS]" in build
    assert ("ARG", "EXTRAS=serve") in steps
    final = steps[max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM"):]
    assert ("USER", "10001:10001") in final and ("EXPOSE", "8080") in final
    assert ("ENTRYPOINT", '["kvembed-entrypoint"]') in final
    assert "/health" in " ".join(healthcheck_command())
    assert docker_env()["KVEMBED_HOST"] == "0.0.0.0"


def test_the_dockerfile_copies_only_what_the_context_holds() -> None:
    """Each ``COPY`` from the build context names a file of the checkout that .dockerignore lets
    in; the venv, artifacts, caches and .git stay out."""
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
                if line.strip() and not line.startswith("#")]
    copied = [args.split() for keyword, args in instructions() if keyword == "COPY" and "--from=" not in args]
    sources = [word for words in copied for word in words[:-1] if not word.startswith("--")]
    assert "src" in sources and "deploy/docker/entrypoint.sh" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not dockerignored(source, patterns), f"{source} is copied but .dockerignore leaves it out"
    assert not dockerignored("src/kvembed/serve/app.py", patterns)
    for path in (".venv/bin/python", "artifacts/smollm2-kv/model.onnx", ".git/HEAD", "src/kvembed/__pycache__/x.pyc",
                 ".pytest_cache/v", "tests/test_deploy.py", "benchmarks/log/serve.md"):
        assert dockerignored(path, patterns), f"{path} would be sent to the build"


def test_the_entrypoint_passes_shellcheck() -> None:
    done = subprocess.run([tool("shellcheck"), str(ENTRYPOINT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_every_manifest_validates_strictly(version: str) -> None:
    from kubernetes_validate.utils import latest_version

    wanted = latest_version() if version == "latest" else version
    files = sorted(str(p) for p in KUBE.glob("*.yaml") if p.name != "kustomization.yaml")
    done = subprocess.run([tool("kubernetes-validate"), "--strict", "-k", wanted, *files], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    passed = re.findall(r"^INFO (\S+) passed for resource", done.stdout, re.MULTILINE)
    assert sorted(passed) == files, done.stdout  # a kind without a schema is only a WARN: none may be
    assert "WARN" not in done.stdout and "ERROR" not in done.stdout


def test_strict_validation_refuses_an_unknown_field(tmp_path: Path) -> None:
    """The validator really is strict: a misspelt probe field fails."""
    deployment = manifests()["deployment.yaml"]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSecond"] = 5
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump(deployment), encoding="utf-8")
    done = subprocess.run([tool("kubernetes-validate"), "--strict", str(tmp_path / "typo.yaml")], capture_output=True, text=True)
    assert done.returncode != 0 and "periodSecond" in done.stdout


def test_the_kustomization_applies_every_manifest_but_the_example_secret() -> None:
    kustomization = manifests()["kustomization.yaml"]
    assert set(kustomization["resources"]) == APPLIED
    assert set(manifests()) == APPLIED | {"kustomization.yaml", "secret.example.yaml"}
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed: kustomization.yaml not rendered")
    done = subprocess.run([kubectl, "kustomize", str(KUBE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rendered = list(yaml.safe_load_all(done.stdout))
    assert sorted(r["kind"] for r in rendered) == sorted(manifests()[name]["kind"] for name in APPLIED)


def test_the_manifests_agree_with_the_image_and_the_server() -> None:
    """Probes on a GET route kvembed serve has, on the port the image exposes; the user, the
    writable paths and the artifacts folder the image uses; names that point at each other."""
    found = manifests()
    pod = found["deployment.yaml"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    exposed = [int(args) for keyword, args in instructions() if keyword == "EXPOSE"]
    routes = served_routes()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        check = container[probe]["httpGet"]
        assert ("GET", check["path"]) in routes, f"{probe} asks {check['path']}, which kvembed serve does not serve"
        assert check["path"] == "/health"
        assert ports[check["port"]] == 8080 and exposed == [8080] and docker_env()["KVEMBED_PORT"] == "8080"
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 300
    assert "/health" in " ".join(healthcheck_command()) and "KVEMBED_PORT" in " ".join(healthcheck_command())

    service = found["service.yaml"]["spec"]
    assert service["type"] == "ClusterIP" and service["ports"][0]["port"] == 8080
    assert service["ports"][0]["targetPort"] in ports
    labels = pod["metadata"]["labels"]
    for name in ("service.yaml",):
        assert found[name]["spec"]["selector"].items() <= labels.items()
    assert found["pdb.yaml"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = found["hpa.yaml"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == found["deployment.yaml"]["metadata"]["name"]
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]

    env = {e["name"]: e for e in container["env"]}
    key = env["KVEMBED_API_KEY"]["valueFrom"]["secretKeyRef"]
    secret = found["secret.example.yaml"]
    assert key["name"] == secret["metadata"]["name"] and key["key"] in secret["stringData"]

    context = pod["spec"]["securityContext"]
    user = [args for keyword, args in instructions() if keyword == "USER"][-1]
    assert context["runAsNonRoot"] is True and f"{context['runAsUser']}:{context['runAsGroup']}" == user
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    for writable in ("/tmp", env["KVEMBED_CACHE_DIR"]["value"]):
        assert "emptyDir" in mounts[writable], f"{writable} must be writable: an emptyDir"
    artifacts = mounts[docker_env()["KVEMBED_ARTIFACTS"]]
    assert artifacts["persistentVolumeClaim"]["claimName"] == found["pvc.yaml"]["metadata"]["name"]


def entrypoint(*args: str, env: dict[str, str], **kwargs) -> subprocess.Popen:
    """The image's entrypoint as the image runs it (``sh``, kvembed on PATH)."""
    return subprocess.Popen(["sh", str(ENTRYPOINT), *args], env=env, **kwargs)


def base_env(artifacts: Path, port: int) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "KVEMBED_ARTIFACTS": str(artifacts),
            "KVEMBED_HOST": "127.0.0.1", "KVEMBED_PORT": str(port), "KVEMBED_THREADS": "1", "KVEMBED_API_KEY": "s3cret"}


def test_the_entrypoint_serves_every_artifact_until_sigterm(stories_artifact, tmp_path: Path) -> None:
    """Two real artifacts in a folder, as mounted at /artifacts (the demo export twice under two
    names: one export keeps the test short): the entrypoint serves both under their folder names with the options given after it, the HEALTHCHECK command passes while it
    serves and fails once SIGTERM has stopped it (exit 0: the shell exec'd the server)."""
    folder = tmp_path / "artifacts"
    folder.mkdir()
    exported = stories_artifact("kv-embedding")
    shutil.copytree(exported, folder / "stories-kv")
    shutil.copytree(exported, folder / "stories-kv-copy")
    (folder / "notes").mkdir()  # a folder without kvembed.json is not an artifact
    port = free_port()
    env = base_env(folder, port)
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        server = entrypoint("--max-input-tokens", "64", env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, log.read_text(errors="replace")
            try:
                health = httpx.get(f"{url}/health", timeout=2)
                if health.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "not healthy in time:\n" + log.read_text(errors="replace")
            time.sleep(0.1)
        assert sorted(health.json()["models"]) == ["stories-kv", "stories-kv-copy"]
        assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401
        models = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer s3cret"}, timeout=10).json()["data"]
        assert {m["id"]: m["max_input_tokens"] for m in models} == {"stories-kv": 64, "stories-kv-copy": 64}
        check = subprocess.run(healthcheck_command(), env=env, capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0, log.read_text(errors="replace")
    finally:
        stop_process(server, 5)
    assert "serving 2 artifact(s)" in log.read_text(errors="replace")
    check = subprocess.run(healthcheck_command(), env=env, capture_output=True, text=True, timeout=30)
    assert check.returncode != 0, "the HEALTHCHECK passes with no server"


def test_the_entrypoint_refuses_an_empty_folder_and_execs_other_commands(tmp_path: Path) -> None:
    env = base_env(tmp_path, free_port())
    done = entrypoint(env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = done.communicate(timeout=30)
    assert done.returncode == 2 and f"no artifact under {tmp_path}" in err
    done = entrypoint("python", "-c", "print('ran as given')", env=env, stdout=subprocess.PIPE, text=True)
    out, _ = done.communicate(timeout=30)
    assert done.returncode == 0 and out.strip() == "ran as given"
