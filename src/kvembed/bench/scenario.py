"""Benchmark scenarios: a short TOML file each, what ``kvembed bench --scenario FILE`` runs.

A scenario names what to measure in :class:`~kvembed.bench.runner.BenchConfig`'s own words (model
or artifact, method, precisions, the grid of batch sizes and lengths, the backends timed, repeats),
plus a ``description`` and a ``[smoke]`` table: the overrides that shrink it to seconds (the demo
model, one small cell, few calls), which CI runs for every scenario so that none rots. The runner
is the bench's own (:func:`~kvembed.bench.runner.run_bench`): every scenario reports latency,
throughput, peak RSS and the fraction of this machine's GEMM peak each cell reached.

    description = "16 short texts: the fixed cost per call"
    model = "smollm2-135m"
    precisions = ["fp32", "bf16"]
    batch_sizes = [16]
    seq_lens = [32]

    [smoke]
    model = "stories260k"
    min_seconds = 0.05
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Mapping

from ..errors import InvalidInput

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 takes the backport (a dependency there)
    import tomli as tomllib

#: the keys a scenario (and its ``[smoke]`` table) may set, with the type each takes: BenchConfig's
#: fields as a user gives them (lists for the tuples)
KEYS: dict[str, type | tuple[type, ...]] = {
    "model": str, "method": str, "options": dict, "artifact": str, "precisions": list, "batch_sizes": list,
    "seq_lens": list, "backends": list, "threads": int, "warmup": int, "min_repeats": int,
    "min_seconds": (int, float), "max_repeats": int, "rounds": int, "kind": str, "gemm_size": int, "profile": bool,
    "end_to_end": bool,
}
#: the keys that hold lists, as BenchConfig holds them (tuples)
TUPLES = ("precisions", "batch_sizes", "seq_lens", "backends")
#: keys a scenario may hold beside :data:`KEYS`
META = ("description", "smoke")
#: the most bytes a scenario file may have (a scenario is a few lines)
MAX_BYTES = 64 * 1024


def read_scenario(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The scenario at ``path`` as TOML, checked for its keys and their types; one line naming the
    file and the problem otherwise."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"no scenario file at {str(path)!r}")
    if path.stat().st_size > MAX_BYTES:
        raise InvalidInput(f"scenario {str(path)!r} has more than {MAX_BYTES} bytes: a scenario is a few lines of TOML")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise InvalidInput(f"scenario {str(path)!r} is not TOML: {err}") from None
    _check(data, path, smoke=False)
    smoke = data.get("smoke", {})
    if not isinstance(smoke, dict):
        raise InvalidInput(f"scenario {str(path)!r}: smoke must be a table ([smoke]) of overrides")
    _check(smoke, path, smoke=True)
    return data


def _check(values: Mapping[str, Any], path: Path, smoke: bool) -> None:
    where = f"scenario {str(path)!r}{' [smoke]' if smoke else ''}"
    allowed = set(KEYS) | (set() if smoke else set(META))
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise InvalidInput(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                           f"a scenario takes {', '.join([*META, *KEYS])}")
    for key, value in values.items():
        kind = KEYS.get(key)
        if kind is None:
            if key == "description" and not isinstance(value, str):
                raise InvalidInput(f"{where}: description must be a string")
            continue
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
            raise InvalidInput(f"{where}: {key} must be {_describe(kind)}, got {value!r}")


def _describe(kind: type | tuple[type, ...]) -> str:
    return {str: "a string", dict: "a table", list: "a list", int: "an integer", bool: "true or false"}.get(
        kind, "a number") if not isinstance(kind, tuple) else "a number"


def scenario_values(data: Mapping[str, Any], smoke: bool = False) -> dict[str, Any]:
    """The BenchConfig values of a scenario read by :func:`read_scenario` (its ``[smoke]``
    overrides applied when ``smoke``): lists as tuples, the artifact as a path; the config's own
    check (:meth:`~kvembed.bench.runner.BenchConfig.check`) judges the values."""
    values = {key: value for key, value in data.items() if key in KEYS}
    if smoke:
        overrides = dict(data.get("smoke", {}))
        if "model" in overrides or "artifact" in overrides:  # a smoke run on another model drops the artifact, or the model
            values.pop("artifact" if "model" in overrides else "model", None)
        values.update(overrides)
    for key in TUPLES:
        if key in values:
            values[key] = tuple(values[key])
    if "artifact" in values:
        values["artifact"] = Path(values["artifact"]).expanduser()
    return values
