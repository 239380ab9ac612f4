"""The run plan: which shards exist (input file x row range), and the bookkeeping ``--resume`` needs.

A shard is a fixed range of one input file's rows, so the plan depends only on the inputs and
``--rows-per-file``: a resumed run, on either runner, recomputes the same shards, skips those
already on disk (written atomically, so present means complete) and embeds the rest. ``_run.json``
records what the run was asked to do; :mod:`.output` refuses a resume whose inputs, artifact or
content-changing options would mix two corpora in one output.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..artifact import MANIFEST as ARTIFACT_MANIFEST
from ..artifact import Manifest, load_manifest_and_bytes
from .inputs import Columns, InputFile, find_files, resolve_columns, row_names, scan_file
from .options import CorpusError, CorpusOptions

RUN_FILE = "_run.json"
MANIFEST = "_manifest.json"
SUCCESS = "_SUCCESS"
SHARD_GLOB = "part-*.parquet"
PARTIAL_MARK = ".partial-"
#: options that change what the shards hold: a resume must repeat them
CONTENT_OPTIONS = ("kind", "text_column", "rows_per_file", "output_dtype", "on_error", "windows")
#: content options newer than some run records, with the value a record without them ran with
CONTENT_DEFAULTS = {"windows": False}


@dataclass(frozen=True)
class Shard:
    """Rows ``start <= row < stop`` of input ``file`` (an index into the plan's files); text
    formats start reading at byte ``byte_start``."""

    name: str
    file: int
    start: int
    stop: int
    byte_start: int = 0


@dataclass
class Plan:
    files: list[InputFile]
    empty_files: list[str]
    columns: Columns
    shards: list[Shard]

    def identity(self, options: CorpusOptions, artifact_sha256: str) -> dict[str, Any]:
        """What ``_run.json`` records and a resume must match."""
        return {
            "artifact_manifest_sha256": artifact_sha256,
            **{name: getattr(options, name) for name in CONTENT_OPTIONS},
            "columns": asdict(self.columns),
            "inputs": [{"path": f.path, "bytes": f.bytes, "rows": f.rows} for f in self.files],
            "empty_files": self.empty_files,
        }


def make_plan(options: CorpusOptions) -> Plan:
    """Find and scan the inputs, decide the id source and cut every file into shards."""
    found = find_files(options.inputs, options.format)
    names = row_names([path for path, _ in found])
    scanned = [scan_file(path, names[path], fmt, options.rows_per_file) for path, fmt in found]
    files = [f for f in scanned if f.rows > 0]
    empty = [f.path for f in scanned if f.rows == 0]
    if empty and options.on_error == "fail":
        more = f" (and {len(empty) - 1} more)" if len(empty) > 1 else ""
        raise CorpusError(f"{empty[0]} is empty{more}; remove it from --input or pass --on-error skip")
    columns = resolve_columns(files, options.text_column, options.id_column)
    shards = []
    for index, file in enumerate(files):
        for part, start in enumerate(range(0, file.rows, options.rows_per_file)):
            byte_start = file.offsets[part] if file.offsets else 0
            stop = min(start + options.rows_per_file, file.rows)
            shards.append(Shard(f"part-{index:05d}-{part:05d}.parquet", index, start, stop, byte_start))
    return Plan(files, empty, columns, shards)


def read_artifact(artifact: Path) -> tuple[Manifest, str]:
    """The artifact's typed manifest and its identity, from one read of its manifest. The identity
    is the sha256 of the manifest, which holds every file's sha256; a manifest that records
    certificates (``kvembed verify --record``) is hashed without them: a certificate added while a
    job pauses changes no file, so a resume still matches."""
    if not (Path(artifact) / ARTIFACT_MANIFEST).is_file():
        raise CorpusError(f"{str(artifact)!r} is not a kvembed artifact (no {ARTIFACT_MANIFEST}); give the directory kvembed-export wrote")
    manifest, raw = load_manifest_and_bytes(artifact)
    if "certified" not in manifest.raw:
        return manifest, hashlib.sha256(raw).hexdigest()  # as before certificates existed
    data = {key: value for key, value in manifest.raw.items() if key != "certified"}  # the JSON as read
    return manifest, hashlib.sha256(json.dumps(data, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()
