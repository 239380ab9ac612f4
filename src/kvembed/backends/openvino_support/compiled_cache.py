"""The OpenVINO backend's compiled-model cache: compiled blobs kept on disk between loads, keyed by
a fingerprint that costs a ``stat``, and the staging folders OpenVINO writes a blob into, with the
pid liveness check that clears those left by processes that died while compiling.

Kept apart from the session (:mod:`kvembed.backends.openvino`) because it is a job of its own,
file-system bookkeeping: the session hands it a compiled model or a blob path, and it never
compiles, imports or runs one."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

from ...artifact.staging import write_bytes_atomic, write_text_atomic
from ...cache import cache_root

MEND_VERSION = 3  # bump when what is compiled changes (repeat_kv_heads, the bf16 graph): kept blobs are then rebuilt


def default_cache_dir() -> Path:
    """``KVEMBED_CACHE_DIR``/openvino (default ``~/.cache/kvembed/openvino``)."""
    return cache_root() / "openvino"


class CompiledCache:
    """Compiled models kept on disk, so a second load skips reading, mending and compiling the ONNX.

    One slot per (model file, precision): ``<dir>/<slot>.blob`` is the compiled model as OpenVINO
    exports it and ``<slot>.json`` the fingerprint it was made from (OpenVINO's version, the
    precision, size and mtime of every ``model*`` file beside the graph, external data included); a
    stale slot is rebuilt in place, so the cache grows with the number of models, not of
    re-exports. The blob is imported from a memory map (the weights stay file-backed pages).

    The blob is written by OpenVINO's own ``CACHE_DIR`` into a fresh folder (:meth:`staging`) and
    then moved into its slot (:meth:`adopt`): OpenVINO streams it to the file as it exports, where
    ``export_model()`` would hold all of it in memory, once more the weights. ``CACHE_DIR`` is not
    used to look blobs up: it keys them by a hash of the model, which costs a read of every weight
    (no faster than compiling, benchmarks/log/openvino.md), where the fingerprint costs a ``stat``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory).expanduser()

    def fingerprint(self, model_path: Path, precision: str, version: str) -> dict[str, Any]:
        # every model.* file: an int8 artifact's OpenVINO graph reads model.onnx.data, not a file of its own
        base = model_path.name.split(".")[0]
        files = sorted(p for p in model_path.parent.iterdir() if p.is_file() and p.name.split(".")[0] == base)
        return {
            "model": str(model_path.resolve()),
            "openvino": version,
            "precision": precision,
            "mend": MEND_VERSION,
            "files": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files],
        }

    def slot(self, fingerprint: Mapping[str, Any]) -> Path:
        key = hashlib.sha256(f"{fingerprint['model']}|{fingerprint['precision']}".encode()).hexdigest()[:20]
        return self.directory / key

    def load(self, fingerprint: Mapping[str, Any]) -> Path | None:
        """The blob made from exactly ``fingerprint``, or None."""
        slot = self.slot(fingerprint)
        try:
            if json.loads(slot.with_suffix(".json").read_text()) == fingerprint and slot.with_suffix(".blob").is_file():
                return slot.with_suffix(".blob")
        except (OSError, ValueError):
            pass
        return None

    def store(self, fingerprint: Mapping[str, Any], compiled: Any) -> None:
        """Write ``compiled``'s blob from memory, then its fingerprint (each by atomic rename:
        readers never see half of one); the fallback where :meth:`staging` wrote no blob."""
        slot = self.slot(fingerprint)
        self.directory.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(slot.with_suffix(".blob"), compiled.export_model().getbuffer())
        write_text_atomic(slot.with_suffix(".json"), json.dumps(fingerprint))

    def staging(self) -> Path:
        """A fresh folder in the cache directory for OpenVINO's ``CACHE_DIR`` to write one blob into
        (on the cache's filesystem, so :meth:`adopt` is a rename). Folders left by processes that
        died while compiling (a partial blob each, as big as the weights) are removed first."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for left in self.directory.glob(f"{STAGING_PREFIX}*"):
            if not _alive(left.name[len(STAGING_PREFIX):].split("-", 1)[0]):
                shutil.rmtree(left, ignore_errors=True)
        return Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=self.directory))

    def adopt(self, fingerprint: Mapping[str, Any], blob: Path) -> None:
        """Move ``blob`` (written by OpenVINO into :meth:`staging`) into ``fingerprint``'s slot, then
        write the fingerprint: a reader sees the old slot, no slot, or the new one whole."""
        slot = self.slot(fingerprint)
        slot.with_suffix(".json").unlink(missing_ok=True)  # the old fingerprint never names the new blob
        os.replace(blob, slot.with_suffix(".blob"))
        write_text_atomic(slot.with_suffix(".json"), json.dumps(fingerprint))


#: the cache's staging folders: ``.compiling-<pid>-<random>``
STAGING_PREFIX = ".compiling-"


def _alive(pid: str) -> bool:
    """Whether the process ``pid`` (a string from a folder name) runs; a name that is no pid is not."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # someone else's process
        return True
    return True
