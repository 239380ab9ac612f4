"""A stand-in engine directory (kvembed build-engine's layout) for tests on machines without TensorRT.

Its ``engine.json`` is written by the real ``engine_record`` for the artifact's own graph; only
``engine.plan`` is a placeholder, since no TensorRT can build a real one here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Sequence

from kvembed.export.engine import choose_precision, engine_record, parse_shapes
from kvembed.artifact import load_manifest, sha256_file
from kvembed.artifact.engine import ENGINE_JSON, PLAN

STAND_IN_PLAN = b"stand-in plan: TensorRT cannot run on this machine"
#: two profiles: short sequences up to 4 rows, long ones up to 2
SHAPES = ("1x8:4x32:4x64", "1x65:2x128:2x512")


def make_engine_dir(artifact: Path, out: Path, shapes: Sequence[str] = SHAPES) -> Path:
    manifest = load_manifest(artifact)
    out.mkdir(parents=True)
    for name in ("tokenizer.json", "kvembed.json"):
        shutil.copyfile(artifact / name, out / name)
    (out / PLAN).write_bytes(STAND_IN_PLAN)
    record = engine_record(
        manifest, sha256_file(artifact / "model.onnx"), [parse_shapes(s, manifest.max_length) for s in shapes],
        choose_precision("fp32", "10.14.1", "fp32"), tensorrt_version="10.14.1", gpu_name="NVIDIA L4",
        compute_capability="8.9", build_seconds=1.0, options={}, plan_sha256=sha256_file(out / PLAN),
    )
    (out / ENGINE_JSON).write_text(json.dumps(record))
    return out
