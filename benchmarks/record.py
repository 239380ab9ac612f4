"""One JSON record per benchmark run: what ran, on which machine, when, with which versions, and
the figures it gave, each with its unit.

Why: a figure without its CPU and date cannot be compared or trusted later (this project's
machines differ by 2x and drift by 10-30% within a session), and prose cannot be checked. The
headline figures live as such records in ``benchmarks/results/headline/`` and
``render_results.py`` turns them into the README's and the docs' table; the harnesses write one
with :func:`write_record` after every run, next to their own output.

    from record import figure, write_record
    write_record("goals", {"p1_latency_ratio": figure(0.659, "x")})
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shlex
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping, Sequence

RESULTS = Path(__file__).resolve().parent / "results"
#: where :func:`write_record` puts a run's record unless told otherwise
RECORDS = RESULTS / "records"
#: the CPU flags that decide which kernels run (int8 VNNI, bf16, fp16, AMX)
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16")
#: the packages whose versions change the figures
PACKAGES = ("kvembed", "onnxruntime", "openvino", "torch", "transformers")
#: the fields every record has (a headline record adds ``source`` and ``log``)
REQUIRED = ("benchmark", "command", "date", "cpu", "cores", "memory_bytes", "versions", "figures")


def figure(value: float | int, unit: str) -> dict[str, Any]:
    """One figure: a number and its unit (``x`` for ratios, ``cosine`` / ``spearman`` for scores)."""
    return {"value": value, "unit": unit}


def cpu() -> dict[str, Any]:
    """This CPU's model name, architecture and the :data:`FLAGS` (``amx``: any AMX tile instructions), as
    kvembed itself reads them (:func:`kvembed.bench.report.cpu_model`,
    :func:`kvembed.backends.cpu.cpu_features`: its ``source`` says when KVEMBED_CPU_FEATURES stood in)."""
    from kvembed.backends.cpu import cpu_features
    from kvembed.bench.report import cpu_model

    features = cpu_features()
    flags = set(features.flags)
    return {
        "model": cpu_model(),
        "machine": platform.machine(),
        "flags": {**{name: name in flags for name in FLAGS}, "amx": any(f.startswith("amx_") for f in flags)},
        "flags_source": features.source,
    }


def versions() -> dict[str, str]:
    """Python's version and those of :data:`PACKAGES` that are installed."""
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def memory_bytes() -> int | None:
    """Physical memory, from the OS's page counts (None where it gives none)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def record(benchmark: str, figures: Mapping[str, Mapping[str, Any]], command: str | Sequence[str] | None = None,
           **extra: Any) -> dict[str, Any]:
    """A record of this machine, now, for ``figures``; ``command`` defaults to this process's argv."""
    if command is None:
        command = "python " + shlex.join(sys.argv)
    elif not isinstance(command, str):
        command = shlex.join(command)
    out = {
        "benchmark": benchmark,
        "command": command,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu(),
        "cores": os.cpu_count(),
        "memory_bytes": memory_bytes(),
        "versions": versions(),
        "figures": {name: dict(value) for name, value in figures.items()},
        **extra,
    }
    bad = problems(out)
    if bad:
        raise ValueError(f"record {benchmark!r}: " + "; ".join(bad))
    return out


def write_record(benchmark: str, figures: Mapping[str, Mapping[str, Any]], command: str | Sequence[str] | None = None,
                 directory: Path = RECORDS, **extra: Any) -> Path:
    """Write :func:`record` as ``<directory>/<benchmark>-<UTC time>.json`` and return its path."""
    data = record(benchmark, figures, command, **extra)
    stamp = re.sub(r"[^0-9T]", "", data["date"].split("+")[0])
    path = Path(directory) / f"{benchmark}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"record: {path}")
    return path


def problems(data: Mapping[str, Any]) -> list[str]:
    """What a record lacks: a required field, a CPU model, a figure without a number or a unit."""
    found = [f"no {key}" for key in REQUIRED if key not in data]
    if not isinstance(data.get("cpu"), Mapping) or not data["cpu"].get("model"):
        found.append("no cpu model")
    if not isinstance(data.get("versions"), Mapping):
        found.append("versions is not a mapping")
    figures = data.get("figures")
    if not isinstance(figures, Mapping) or not figures:
        found.append("no figures")
    else:
        for name, value in figures.items():
            if not isinstance(value, Mapping) or not isinstance(value.get("value"), (int, float)) or not value.get("unit"):
                found.append(f"figure {name!r} needs a number and a unit")
    try:
        _dt.date.fromisoformat(str(data.get("date", ""))[:10])
    except ValueError:
        found.append(f"date {data.get('date')!r} is not ISO")
    return found
