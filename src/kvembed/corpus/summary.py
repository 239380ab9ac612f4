"""The run's summary, ``_manifest.json``, and ``_SUCCESS``: what was embedded, with what, and how
much, written last. (Not an artifact's manifest, ``kvembed.json``: the summary names the artifact
it ran, by path, files and method, read from that manifest.)"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from ..artifact import Manifest
from ..version import __version__
from .inputs import SKIP_EXAMPLES
from .options import CorpusOptions
from .plan import MANIFEST, PARTIAL_MARK, SUCCESS, Plan


def build_summary(
    options: CorpusOptions,
    plan: Plan,
    artifact: Manifest,
    artifact_sha256: str,
    stats: Mapping[str, Mapping[str, Any]],
    resumed: int,
    replaced: int,
    wall_time: float,
) -> dict[str, Any]:
    """The run's record. ``stats``: shard name -> the statistics stored in that shard; ``resumed``
    shards were kept from an earlier run, ``replaced`` ones of an earlier run deleted (--overwrite)."""
    shards = [stats[shard.name] for shard in plan.shards]
    per_input: dict[str, dict[str, int]] = {f.path: {"embedded": 0, "skipped": 0} for f in plan.files}
    for item in shards:
        per_input[item["input"]]["embedded"] += item["rows"]
        per_input[item["input"]]["skipped"] += item["skipped"]
    examples = [example for item in shards for example in item["skip_examples"]][:SKIP_EXAMPLES]
    unit = "rows" if plan.files and plan.files[0].format == "parquet" else "lines"
    return {
        "kvembed_version": __version__,
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "artifact": {
            "path": str(Path(options.artifact).resolve()),
            "manifest_sha256": artifact_sha256,
            "files": {name: record.sha256 for name, record in artifact.files.items()},
            "method": artifact.method.to_dict(),
            "precision": artifact.precision,
            "max_length": artifact.max_length,
            # what provider auto (or the one given) ran it on, in every worker (shards older than this say nothing)
            "backends": sorted({item["backend"] for item in shards if item.get("backend")}),
        },
        "embedding": {"dim": artifact.dim, "dtype": options.output_dtype, "kind": options.kind, "normalized": True,
                      **vector_type_record(options.output_dtype, artifact)},
        "options": options.record(),
        "columns": asdict(plan.columns),
        "inputs": [
            {"path": f.path, "format": f.format, "bytes": f.bytes, unit: f.rows, **per_input[f.path]} for f in plan.files
        ],
        "empty_files": plan.empty_files,
        "shards": [
            {key: item[key] for key in ("shard", "input", "start", "stop", "rows", "tokens", "truncated", "skipped")}
            for item in shards
        ],
        "rows": sum(item["rows"] for item in shards),
        "tokens": sum(item["tokens"] for item in shards),
        "truncated": sum(item["truncated"] for item in shards),
        # inputs over max_length embedded whole as windows (--windows; truncated counts those cut instead)
        "windowed": sum(item.get("windowed", 0) for item in shards),
        "skipped": {"count": sum(item["skipped"] for item in shards), "empty_files": len(plan.empty_files), "examples": examples},
        "worker_peak_rss_mb": max((item.get("worker_peak_rss_mb") or 0 for item in shards), default=0),
        "shards_resumed": resumed,
        "shards_replaced": replaced,
        "wall_time_s": round(wall_time, 3),
    }


def vector_type_record(dtype: str, artifact: Manifest) -> dict[str, Any]:
    """What a quantized ``--output-dtype`` wrote (:mod:`kvembed.runtime.quantize`): values per row,
    how bits are packed, and for int8 / uint8 the ranges the levels are of, or where they came from."""
    if dtype.startswith("float"):
        return {}
    from ..runtime.quantize import PACKED, RANGED, width_of

    record: dict[str, Any] = {"vector_type": dtype, "width": width_of(dtype, artifact.dim)}
    if dtype in PACKED:
        record["packing"] = ("numpy.packbits: one bit per dimension, set where the value is positive, the first dimension "
                             "in the highest bit, the last byte padded with zero bits" + ("; binary is each byte - 128 as int8"
                                                                                          if dtype == "binary" else ""))
    if dtype in RANGED:
        stored = artifact.vector_ranges.get("embedding")
        record["ranges"] = ({"from": "the artifact's manifest (vector_ranges.embedding)", **stored.to_dict()} if stored else
                            {"from": "measured at load by each worker on the bundled calibration texts (the artifact's "
                                     "manifest has none: re-export it to store them; Embedder.vector_ranges() on the same "
                                     "backend measures them again)"})
    return record


def write_summary(output: Path, summary: Mapping[str, Any]) -> None:
    """Write ``_manifest.json`` atomically, then the empty ``_SUCCESS`` marker."""
    partial = output / f"{MANIFEST}{PARTIAL_MARK}{os.getpid()}"
    partial.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(partial, output / MANIFEST)
    (output / SUCCESS).write_text("", encoding="utf-8")
