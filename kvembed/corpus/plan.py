"""The run plan: which shards exist (input file x row range), and the bookkeeping ``--resume`` needs.

A shard is a fixed range of one input file's rows, so the plan depends only on the inputs and
``--rows-per-file``: a resumed run, on either engine, recomputes the same shards, skips those
already on disk (written atomically, so present means complete) and embeds the rest. ``_run.json``
records what the first run was asked to do; resuming with different inputs, artifact or
content-changing options fails instead of mixing two corpora in one output.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..runtime.artifact import MANIFEST as ARTIFACT_MANIFEST
from ..runtime.artifact import sha256_file
from .inputs import Columns, InputFile, find_files, resolve_columns, row_names, scan_file
from .options import CorpusError, CorpusOptions

RUN_FILE = "_run.json"
MANIFEST = "_manifest.json"
SUCCESS = "_SUCCESS"
SHARD_GLOB = "part-*.parquet"
PARTIAL_MARK = ".partial-"
#: options that change what the shards hold: a resume must repeat them
CONTENT_OPTIONS = ("kind", "text_column", "rows_per_file", "output_dtype", "on_error")


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


def artifact_sha256(artifact: Path) -> str:
    """The artifact's identity: the sha256 of its manifest, which holds every file's sha256."""
    path = Path(artifact) / ARTIFACT_MANIFEST
    if not path.is_file():
        raise CorpusError(f"{str(artifact)!r} is not a kvembed artifact (no {ARTIFACT_MANIFEST}); give the directory kvembed-export wrote")
    return sha256_file(path)


def prepare_output(output: Path, identity: dict[str, Any], resume: bool) -> None:
    """Create ``output`` for a fresh run, or check that a resumed one matches the first run.

    Without ``--resume`` an output holding an earlier run is refused (nothing is overwritten).
    Leftover partial shards of an interrupted run are removed either way.
    """
    run_file = output / RUN_FILE
    if output.exists() and not output.is_dir():
        raise CorpusError(f"--output {str(output)!r} is a file; give a directory")
    if run_file.is_file():
        if not resume:
            raise CorpusError(
                f"{str(output)!r} holds an earlier run; pass --resume to finish it, or choose an empty --output"
            )
        previous = json.loads(run_file.read_text(encoding="utf-8"))
        for key, value in identity.items():
            if previous.get(key) != value:
                raise CorpusError(
                    f"--resume: {str(output)!r} was started with a different {key.replace('_', ' ')} "
                    f"({_short(previous.get(key))} vs now {_short(value)}); resume with the same inputs, artifact "
                    "and options, or choose a new --output"
                )
    elif output.is_dir() and any(output.glob(SHARD_GLOB)):
        raise CorpusError(f"{str(output)!r} already holds part-*.parquet shards not written by this tool; choose an empty --output")
    output.mkdir(parents=True, exist_ok=True)
    for stale in output.glob(f"*{PARTIAL_MARK}*"):
        stale.unlink(missing_ok=True)
    (output / SUCCESS).unlink(missing_ok=True)
    if not run_file.is_file():
        partial = output / (RUN_FILE + PARTIAL_MARK + str(os.getpid()))
        partial.write_text(json.dumps(identity, indent=2) + "\n", encoding="utf-8")
        os.replace(partial, run_file)


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 120 else text[:117] + "..."
