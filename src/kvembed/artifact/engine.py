"""The engine directory's contract: what ``kvembed build-engine`` writes beside an artifact's
tokenizer and manifest (``engine.plan`` and its record ``engine.json``), and the one rule every
reader applies to tell such a directory from an artifact.

Torch-free and TensorRT-free: the runtime's catalogue, serve's preflight, the Triton generator,
the bundle and the signature check read engine directories through it; the TensorRT backend
(:mod:`kvembed.backends.tensorrt`) runs the plan, the builder (:mod:`kvembed.export.engine`)
writes the record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from ..errors import InvalidInput
from .layout import ENGINE_JSON, PLAN

__all__ = [
    "CLAIMED", "ENGINE_JSON", "ENGINE_KEYS", "ENGINE_SCHEMA_VERSION", "Limits", "PLAN", "describe_profiles",
    "engine_limits", "is_engine_dir", "read_engine_json",
]

ENGINE_SCHEMA_VERSION = 1
#: keys every engine.json has (loaders and the Triton generator rely on them)
ENGINE_KEYS = ("schema_version", "tensorrt_version", "gpu", "profiles", "precision", "strongly_typed",
               "source", "build", "inputs")
#: what an engine directory is, in messages
CLAIMED = "a TensorRT engine directory"


class Limits(NamedTuple):
    """The shapes a session takes, over all its shapes' ranges: rows per call and padded sequence
    length (a TensorRT plan's profiles; a session without limits has ``limits`` None), and each
    profile's ``(min_sequence, max_sequence, max_batch)``, which :meth:`rows` reads."""

    max_batch_size: int
    min_sequence: int
    max_sequence: int
    profiles: tuple[tuple[int, int, int], ...] = ()

    def rows(self, width: int) -> int:
        """The most rows one call of ``width`` padded tokens may have: the largest batch among the
        profiles that take that length (the overall largest where none does, or none are listed:
        the session then says why a shape does not fit)."""
        fitting = [batch for low, high, batch in self.profiles if low <= width <= high]
        return max(fitting) if fitting else self.max_batch_size


def is_engine_dir(directory: str | os.PathLike[str]) -> bool:
    """The one engine rule: a directory holding ``engine.json`` is an engine directory (it runs on
    TensorRT and nowhere else), whatever else it holds."""
    return (Path(directory) / ENGINE_JSON).is_file()


def read_engine_json(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """``engine.json`` of ``directory``, checked for every key of :data:`ENGINE_KEYS` and the schema."""
    path = Path(directory) / ENGINE_JSON
    if not path.is_file():
        raise FileNotFoundError(f"{directory} has no {ENGINE_JSON}: not an engine directory (kvembed build-engine makes one)")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as err:
        raise InvalidInput(f"{path} is not valid JSON ({err}): rebuild the engine with kvembed build-engine") from None
    if not isinstance(record, dict):
        raise InvalidInput(f"{path} is not a JSON object: rebuild the engine with kvembed build-engine")
    for key in ENGINE_KEYS:
        if key not in record:
            raise InvalidInput(f"{path} lacks {key}: rebuild the engine with kvembed build-engine")
    if record["schema_version"] != ENGINE_SCHEMA_VERSION:
        raise InvalidInput(f"{path} has schema_version {record['schema_version']!r}; this kvembed reads {ENGINE_SCHEMA_VERSION}")
    return record


def engine_limits(record: Mapping[str, Any]) -> Limits:
    """:class:`Limits` of the record's profiles: what the Embedder batches, pads and cuts to (and
    Triton's max_batch_size: the largest profile batch)."""
    profiles = record["profiles"]
    return Limits(max(p["max"][0] for p in profiles), min(p["min"][1] for p in profiles), max(p["max"][1] for p in profiles),
                  tuple((p["min"][1], p["max"][1], p["max"][0]) for p in profiles))


def describe_profiles(record: Mapping[str, Any]) -> str:
    """``"1x16..32x512, 1x8..1x64"``: each profile's min and max batch x sequence."""
    return ", ".join(f"{p['min'][0]}x{p['min'][1]}..{p['max'][0]}x{p['max'][1]}" for p in record["profiles"])
