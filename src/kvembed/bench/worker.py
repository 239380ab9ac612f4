"""One backend's cells in a process of its own, so its peak RSS is its own.

The orchestrator starts a fresh interpreter (never a fork: it would inherit the parent's torch,
memory and thread pools) per backend and precision, hands it the padded batches in a pickle, and
reads progress lines from its stdout and the results from a pickle it writes. The child imports only its backend, records RSS after the imports, after
loading, and at its peak, and sends back each cell's latency samples and embeddings.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import CheckFailed, InvalidInput
from .measure import (
    SUBJECTS, AutoSubject, OpenVINOSubject, RuntimeSubject, ServedSubject, TorchSubject, current_rss_mb, time_calls,
)

#: subject name -> its class (each opens the artifact directory)
SUBJECT_TYPES = {"runtime": RuntimeSubject, "torch": TorchSubject, "openvino": OpenVINOSubject, "auto": AutoSubject,
                 "served": ServedSubject}

#: calls an end-to-end cell's split by stage is the median of (untimed: they run after the timed ones)
STAGE_CALLS = 20

#: child exceptions re-raised as themselves in the parent (they carry a user-facing message)
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, FileNotFoundError, NotImplementedError)


class BenchError(CheckFailed, RuntimeError):
    """A benchmark process failed (not a user error): crashed, killed, or raised unexpectedly."""


@dataclass
class CellInput:
    """One padded batch to time; ``key`` names the cell in the results."""

    key: str
    inputs: dict[str, np.ndarray]
    texts: tuple[str, ...] = ()
    """The rows' texts (what ``inputs`` encodes, prompt aside): what an end-to-end subject embeds."""
    kind: str = "document"


@dataclass
class WorkerSpec:
    """Everything a child needs; picklable (sent to a spawned process)."""

    subject: str
    """What it times: a name of :data:`~kvembed.bench.measure.SUBJECTS` (``runtime``, ``torch``, ...)."""
    artifact: str
    threads: int
    cells: list[CellInput]
    warmup: int = 1
    min_repeats: int = 5
    min_seconds: float = 1.0
    max_repeats: int = 1000
    end_to_end: bool = False
    """Time ``Embedder.encode(cell.texts)`` instead of the graph call on ``cell.inputs``."""
    label: str = field(default="")

    def __post_init__(self) -> None:
        if self.subject not in SUBJECTS:
            raise InvalidInput(f"unknown subject {self.subject!r}; choose from {', '.join(SUBJECTS)}")
        if not self.label:
            self.label = self.subject


def measure_cells(spec: WorkerSpec, report: Callable[[str, Any], None]) -> dict[str, Any]:
    """Load the backend and time every cell (runs in the child; callable in-process for tests)."""
    kind = SUBJECT_TYPES[spec.subject]
    kind.prepare()
    rss_imported = current_rss_mb()
    start = time.perf_counter()
    backend = kind(spec.artifact, spec.threads)
    load_seconds = time.perf_counter() - start
    rss_loaded = current_rss_mb()
    report("loaded", {"label": spec.label, "load_seconds": load_seconds})
    cells: dict[str, Any] = {}
    try:
        for cell in spec.cells:
            if spec.end_to_end:
                call = functools.partial(backend.encode, list(cell.texts), cell.kind)
            else:
                call = functools.partial(backend.run, cell.inputs)
            output = np.asarray(call(), dtype=np.float32)  # an untimed check run: compared across backends
            samples = time_calls(call, warmup=spec.warmup, min_repeats=spec.min_repeats,
                                 min_seconds=spec.min_seconds, max_repeats=spec.max_repeats)
            cells[cell.key] = {"samples": samples, "output": output}
            if spec.end_to_end:  # after the timed calls, in calls of their own: the split costs a little
                cells[cell.key]["stages_ms"] = backend.stages(list(cell.texts), cell.kind, min(len(samples), STAGE_CALLS))
            report("cell", cell.key)
        peak = backend.peak_rss_mb()  # the model's process: this one, or a served subject's server
    finally:
        backend.close()
    return {
        "label": spec.label,
        "backend": spec.subject,  # the results' key (render_results.py reads it)
        "precision": backend.precision,
        "load_seconds": load_seconds,
        "rss_after_imports_mb": rss_imported,
        "rss_after_load_mb": rss_loaded,
        "load_rss_mb": rss_loaded - rss_imported,
        "peak_rss_mb": peak,
        "torch_loaded": "torch" in sys.modules,  # the runtime's process must not pay for torch
        "cells": cells,
    }


PREFIX = "KVEMBED-BENCH "


def child_main(argv: list[str] | None = None) -> int:
    """``python -m kvembed.bench.worker SPEC RESULT``: measure the pickled spec, pickle the result.

    Progress goes to stdout as ``KVEMBED-BENCH <kind> <json>`` lines (other output is ignored).
    """
    spec_path, result_path = (sys.argv[1:] if argv is None else argv)[:2]
    with open(spec_path, "rb") as handle:
        spec = pickle.load(handle)

    def report(kind: str, payload: Any) -> None:
        print(PREFIX + kind + " " + json.dumps(payload), flush=True)

    try:
        outcome: dict[str, Any] = {"result": measure_cells(spec, report)}
        code = 0
    except BaseException as err:  # report everything; the parent decides what it means
        outcome = {"error": {"type": type(err).__name__, "message": str(err), "traceback": traceback.format_exc()}}
        code = 1
    with open(result_path, "wb") as handle:
        pickle.dump(outcome, handle, protocol=pickle.HIGHEST_PROTOCOL)
    return code


def run_isolated(spec: WorkerSpec, on_event: Callable[[str, Any], None] | None = None) -> dict[str, Any]:
    """Run ``spec`` in a fresh interpreter; ``on_event(kind, payload)`` sees ``loaded`` and ``cell``.

    A fresh ``python -m kvembed.bench.worker`` rather than multiprocessing's spawn: spawn re-runs
    the caller's ``__main__`` module in the child, so a script's top-level ``import torch`` (or an
    unguarded ``run_bench`` call) would land in the runtime's process and its RSS.

    User errors raised in the child (e.g. the artifact's source model cannot be found) are raised
    again as the same type; anything else, or a child that dies (out of memory), is a BenchError.
    """
    on_event = on_event or (lambda kind, payload: None)
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="kvembed-bench-") as tmp:
        spec_path, result_path, log_path = (Path(tmp) / name for name in ("spec.pkl", "result.pkl", "stderr.log"))
        with open(spec_path, "wb") as handle:
            pickle.dump(spec, handle, protocol=pickle.HIGHEST_PROTOCOL)
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "kvembed.bench.worker", str(spec_path), str(result_path)],
                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, env=env, text=True, bufsize=1,
            )
            try:
                assert process.stdout is not None
                for line in process.stdout:
                    if line.startswith(PREFIX):
                        kind, _, payload = line[len(PREFIX):].rstrip("\n").partition(" ")
                        on_event(kind, json.loads(payload) if payload else None)
                code = process.wait()
            finally:
                if process.poll() is None:
                    process.terminate()
                    try:
                        process.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait()
        if not result_path.exists():
            hint = " (killed: out of memory?)" if code in (-9, 137) else ""
            tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-12:])
            raise BenchError(f"the {spec.label} benchmark process died with exit code {code}{hint}\n{tail}".rstrip())
        with open(result_path, "rb") as handle:
            outcome = pickle.load(handle)
    if "error" in outcome:
        raise _child_error(spec.label, outcome["error"])
    return outcome["result"]


def _child_error(label: str, info: Mapping[str, Any]) -> BaseException:
    by_name = {cls.__name__: cls for cls in USER_ERRORS}
    if info["type"] in by_name:
        return by_name[info["type"]](f"{label}: {info['message']}")
    if info["type"] == "KeyboardInterrupt":
        return KeyboardInterrupt()
    tail = "".join(info["traceback"].strip().splitlines(keepends=True)[-12:])
    return BenchError(f"the {label} benchmark failed: {info['type']}: {info['message']}\n{tail}")


if __name__ == "__main__":
    sys.exit(child_main())
