"""kvembed as wheels (issue 58): ``python -m build`` makes an sdist and a wheel from a copy of this
tree; the wheel installed alone into a fresh venv, with no checkout beside it, is the torch-free
runtime (``Embedder`` embeds with an artifact, ``import torch`` fails), with the ``cli`` extra
every command runs as tests/cli_smoke.py checks it, and the wheel holds every file of the package
and each extra's requirements. ``packaging/kvembed-gpu`` builds the ``kvembed-gpu`` wheel, whose runtime is
onnxruntime-gpu alone; with the CPU build installed beside it, loading an artifact warns, with the fix.

The kvembed-gpu checks download and unpack onnxruntime-gpu (hundreds of MB, from pip's cache after
the first run): ``KVEMBED_TEST_GPU_WHEEL=0`` leaves them out, and they skip, saying so, where that
download fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: what a build needs of the tree
TREE = ("pyproject.toml", "README.md", "src", "packaging")
#: words in pip's output when the index, not the package, is the problem
NETWORK_WORDS = ("No matching distribution", "Could not find a version", "ConnectionError", "Max retries",
                 "Temporary failure", "Network is unreachable", "timed out", "HTTPSConnectionPool")


def run(*args: str, cwd: Path, timeout: int = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(list(args), capture_output=True, text=True, cwd=cwd, timeout=timeout, env={**clean, **(env or {})})


def checked(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, (result.args, result.stdout[-3000:], result.stderr[-3000:])
    return result


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of what a build reads (no caches, no egg-info), so nothing is written into the checkout."""
    copy = tmp_path_factory.mktemp("tree")
    junk = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist", "*.pyc")
    for name in TREE:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=junk)
        else:
            shutil.copy2(source, copy / name)
    return copy


@pytest.fixture(scope="module")
def dist(tree) -> Path:
    """``python -m build`` of the tree: the sdist, then the wheel built from it."""
    started = time.perf_counter()
    checked(run(sys.executable, "-m", "build", "--outdir", str(tree / "dist"), cwd=tree))
    print(f"\npython -m build: {time.perf_counter() - started:.1f} s")
    return tree / "dist"


def fresh_venv(where: Path) -> Path:
    """A new venv's python (pip included, nothing else)."""
    venv.EnvBuilder(with_pip=True).create(where)
    return where / "bin" / "python"


def pip_install(python: Path, *requirements: str, cwd: Path) -> subprocess.CompletedProcess:
    return run(str(python), "-m", "pip", "install", "-q", *requirements, cwd=cwd, timeout=900)


def test_python_m_build_gives_an_sdist_and_a_wheel(dist):
    assert len(list(dist.glob("kvembed-*.tar.gz"))) == 1, list(dist.iterdir())
    wheels = list(dist.glob("kvembed-*-py3-none-any.whl"))
    assert len(wheels) == 1, list(dist.iterdir())


def test_the_wheel_alone_is_the_torch_free_runtime_then_the_cli_extra_runs_every_command(dist, stories_artifact, tmp_path):
    """The wheel alone in a fresh venv with no checkout beside it: the torch-free runtime embeds.
    Then ``kvembed[cli]`` adds the command: tests/cli_smoke.py runs every ``--help`` and ``kvembed
    embed`` there, and each command whose extra is not installed exits 2 with one line naming it.
    One venv, the extra installed onto what the wheel left, as a user adds it."""
    artifact = stories_artifact("kv-embedding")
    wheel = next(dist.glob("kvembed-*.whl"))
    away = tmp_path / "elsewhere"  # the working directory: no checkout beside it
    away.mkdir()
    started = time.perf_counter()
    python = fresh_venv(tmp_path / "venv")
    checked(pip_install(python, str(wheel), cwd=away))
    installed = time.perf_counter() - started
    torch = run(str(python), "-c", "import torch", cwd=away)
    assert torch.returncode != 0 and "No module named 'torch'" in torch.stderr, torch.stderr
    embedded = checked(run(str(python), "-c", (
        "import sys, kvembed; from kvembed.runtime import Embedder; "
        f"e = Embedder.load({str(artifact)!r}); v = e.encode(['A cat sat on the mat.', 'Stocks fell.']); "
        "print(kvembed.__file__); print(v.shape, round(float((v * v).sum(axis=1).min()), 4), 'torch' in sys.modules)"), cwd=away))
    where, facts = embedded.stdout.strip().splitlines()[-2:]
    assert Path(where).resolve().is_relative_to((tmp_path / "venv").resolve()), where  # the wheel's, not the tree's
    assert facts == "(2, 64) 1.0 False", facts
    missing = run(str(python.parent / "python"), "-c", "import typer", cwd=away)
    assert missing.returncode != 0  # the cli is an extra
    checked(pip_install(python, f"kvembed[cli] @ {wheel.resolve().as_uri()}", cwd=away))
    absent = checked(run(str(python), "-c", "import importlib.util as u; "
                         "print([m for m in ('torch', 'fastapi', 'pyarrow') if u.find_spec(m)])", cwd=away))
    assert absent.stdout.strip() == "[]", "the cli extra alone must not bring torch, fastapi or pyarrow"
    smoke = run(str(python), str(ROOT / "tests" / "cli_smoke.py"), str(artifact), cwd=away)
    assert smoke.returncode == 0 and "cli_smoke: ok" in smoke.stdout, smoke.stderr[-4000:]
    print(f"\nwheel into a fresh venv: {installed:.1f} s; with the cli {time.perf_counter() - started:.1f} s")


def test_the_wheel_holds_every_file_of_the_package_and_its_extras(dist, tree):
    """What ``kvembed[export]`` runs is in the wheel: every file of the package (the demo model, the
    gate's and calibration texts, the sample tasks), and each extra's requirements in its metadata,
    as pyproject.toml declares them (the export path itself is tested from the tree, and the
    Quickstart installs it in CI)."""
    import tomllib
    import zipfile

    from packaging.requirements import Requirement

    wheel = next(dist.glob("kvembed-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        held = set(archive.namelist())
        metadata = next(archive.read(n).decode() for n in held if n.endswith(".dist-info/METADATA"))
    package = tree / "src"
    junk = ("__pycache__", ".pyc")
    files = {p.relative_to(package).as_posix() for p in (package / "kvembed").rglob("*")
             if p.is_file() and not any(j in p.as_posix() for j in junk)}
    assert files and not sorted(files - held), sorted(files - held)[:20]
    extras = tomllib.loads((tree / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    required = [Requirement(line.split(":", 1)[1]) for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    for extra, requirements in extras.items():
        assert f"Provides-Extra: {extra}" in metadata, extra
        for requirement in map(Requirement, requirements):
            assert any(r.name == requirement.name and r.marker is not None and f'extra == "{extra}"' in str(r.marker)
                       for r in required), (extra, str(requirement))


# -- kvembed-gpu ---------------------------------------------------------------------------------------

GPU_WHEEL_ENV = "KVEMBED_TEST_GPU_WHEEL"
gpu_wheel_check = pytest.mark.skipif(
    os.environ.get(GPU_WHEEL_ENV, "") == "0",
    reason=f"{GPU_WHEEL_ENV}=0: the kvembed-gpu wheel checks (they install onnxruntime-gpu) left out",
)


@pytest.fixture(scope="module")
def gpu_wheel(tree) -> Path:
    out = tree / "dist-gpu"
    checked(run(sys.executable, "-m", "build", "--wheel", "--outdir", str(out), "packaging/kvembed-gpu", cwd=tree))
    return next(out.glob("kvembed_gpu-*-py3-none-any.whl"))


@pytest.fixture(scope="module")
def gpu_venv(gpu_wheel, tmp_path_factory) -> Path:
    """A fresh venv with the kvembed-gpu wheel alone; skipped where onnxruntime-gpu cannot be downloaded."""
    where = tmp_path_factory.mktemp("gpu")
    started = time.perf_counter()
    python = fresh_venv(where / "venv")
    done = pip_install(python, str(gpu_wheel), cwd=where)
    if done.returncode != 0 and any(word in done.stderr for word in NETWORK_WORDS):
        pytest.skip(f"onnxruntime-gpu could not be downloaded here: {done.stderr.strip().splitlines()[-1]}")
    checked(done)
    print(f"\nkvembed-gpu into a fresh venv (onnxruntime-gpu included): {time.perf_counter() - started:.1f} s")
    return python


@gpu_wheel_check
def test_kvembed_gpu_has_onnxruntime_gpu_alone_with_the_gpu_providers(gpu_venv, tmp_path):
    shown = checked(run(str(gpu_venv), "-c", (
        "import onnxruntime as o, importlib.metadata as m; print(o.get_available_providers()); "
        "print(sorted(d.metadata['Name'].lower() for d in m.distributions() if d.metadata['Name'].lower().startswith(('onnxruntime', 'kvembed'))))"),
        cwd=tmp_path))
    providers, names = shown.stdout.strip().splitlines()[-2:]
    assert "CUDAExecutionProvider" in providers and "TensorrtExecutionProvider" in providers, providers
    assert names == "['kvembed-gpu', 'onnxruntime-gpu']", names
    version = checked(run(str(gpu_venv.parent / "kvembed"), "--version", cwd=tmp_path))  # the cli comes with it
    assert version.stdout.startswith("kvembed "), version.stdout


@gpu_wheel_check
def test_both_onnxruntime_builds_installed_warn_at_load_with_the_fix(gpu_venv, stories_artifact, tmp_path):
    """The CPU build installed over the GPU one (what ``kvembed[gpu]`` beside the core dependency can
    leave): loading an artifact warns in one line with the fix, and asking for CUDA says the same."""
    artifact = stories_artifact("kv-embedding")
    checked(pip_install(gpu_venv, "--no-deps", "onnxruntime", cwd=tmp_path))
    try:
        said = checked(run(str(gpu_venv.parent / "kvembed"), "embed", str(artifact), "A cat sat.", cwd=tmp_path,
                           env={"COLUMNS": "300"}))
        warned = [line for line in said.stderr.splitlines() if line.startswith("warning:")]
        assert len(warned) == 1 and "onnxruntime and onnxruntime-gpu are both installed" in warned[0], said.stderr
        assert "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu" in warned[0]
        refused = run(str(gpu_venv.parent / "kvembed"), "embed", str(artifact), "--provider", "cuda", "x", cwd=tmp_path,
                      env={"COLUMNS": "300"})
        assert refused.returncode == 2 and "both installed" in refused.stderr and "pip uninstall -y" in refused.stderr, refused.stderr
    finally:  # the module's venv back to kvembed-gpu alone, for any test after this one
        run(str(gpu_venv), "-m", "pip", "uninstall", "-q", "-y", "onnxruntime", cwd=tmp_path)
