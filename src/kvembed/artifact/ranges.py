"""The manifest's ``vector_ranges``: per graph output (``embedding``, ``embedding.<label>``), each
dimension's minimum and maximum over the artifact's own normalised vectors of the bundled
calibration texts, measured by the exporter once the gate passed. int8 and uint8 vectors
(:mod:`kvembed.runtime.quantize`) are levels of these ranges. An artifact from before them has
none (the runtime measures them at load).

The JSON is read as hostile input: a key must name a normalised output of the manifest, and
``min`` and ``max`` must be lists of finite numbers as long as that output is wide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ..errors import InvalidInput, shown
from .jsonform import field_keys, over_raw


@dataclass(frozen=True)
class VectorRange:
    """One output's ranges: ``min`` and ``max`` per dimension, over ``texts`` calibration texts
    (each embedded as every kind of the method)."""

    min: tuple[float, ...]
    max: tuple[float, ...]
    texts: int | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return over_raw(self, field_keys(VectorRange), _unchecked, skip_none=("texts",))


def _unchecked(data: Mapping[str, Any]) -> VectorRange:
    return VectorRange(tuple(data.get("min") or ()), tuple(data.get("max") or ()), data.get("texts"), dict(data))


def _ends(value: Any, width: int, where: str) -> tuple[float, ...]:
    if not isinstance(value, list) or len(value) != width:
        got = f"a list of {len(value)}" if isinstance(value, list) else shown(value)
        raise InvalidInput(f"{where} must be a list of {width} numbers (the output's width), got {got}")
    for index, item in enumerate(value):
        if not isinstance(item, (int, float)) or isinstance(item, bool) or not math.isfinite(item):
            raise InvalidInput(f"{where}[{index}] must be a finite number, got {shown(item)}")
    return tuple(float(item) for item in value)


def vector_ranges_of(data: Any, where: str, outputs: Iterable[Any]) -> dict[str, VectorRange]:
    """The manifest's ``vector_ranges`` typed and checked against its ``outputs`` (TensorSpecs;
    missing or null: none)."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise InvalidInput(f"{where} must be an object (output name -> its min and max), got {shown(data)}")
    widths = {spec.name: spec.shape[-1] for spec in outputs if spec.normalized is not False and spec.shape}
    ranges = {}
    for name, item in data.items():
        at = f"{where}[{shown(name)}]"
        width = widths.get(name)
        if not isinstance(width, int) or isinstance(width, bool):
            raise InvalidInput(f"{at} names no normalised output of the graph (its outputs: {', '.join(map(str, widths))})")
        if not isinstance(item, Mapping):
            raise InvalidInput(f"{at} must be an object with min, max and texts, got {shown(item)}")
        low, high = _ends(item.get("min"), width, f"{at}.min"), _ends(item.get("max"), width, f"{at}.max")
        wrong = next((i for i, (a, b) in enumerate(zip(low, high)) if a > b), None)
        if wrong is not None:
            raise InvalidInput(f"{at}: min[{wrong}] {low[wrong]} is above max[{wrong}] {high[wrong]}")
        texts = item.get("texts")
        if texts is not None and (not isinstance(texts, int) or isinstance(texts, bool) or texts < 1):
            raise InvalidInput(f"{at}.texts must be a positive integer, got {shown(texts)}")
        ranges[str(name)] = VectorRange(low, high, texts, dict(item))
    return ranges
