"""Where the time goes: onnxruntime's own profiler, aggregated by operator type. Torch-free.

The session is created with the runtime's options, so the profile shows the graph after the
fusions onnxruntime applies at load (SimplifiedLayerNormalization, FusedMatMul, QuickGelu, ...),
i.e. what actually runs, not the ops written in ``model.onnx``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..errors import InvalidInput


def op_breakdown(
    model_path: str | os.PathLike[str], feeds: Mapping[str, Any], threads: int, runs: int = 2
) -> dict[str, Any]:
    """Kernel time per operator type over ``runs`` calls (after one unprofiled warm-up call).

    Returns ``{"runs", "kernel_ms_per_run", "ops": [{"op", "ms_per_run", "share", "nodes"}, ...]}``
    sorted by time, shares of total kernel time.
    """
    import onnxruntime as ort

    from ..backends.catalogue import BACKENDS

    session_options = BACKENDS["onnxruntime"].load().session_options

    if runs < 1:
        raise InvalidInput(f"runs must be >= 1, got {runs}")
    with tempfile.TemporaryDirectory(prefix="kvembed-profile-") as tmp:
        options = session_options(threads)
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "ort")
        session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        inputs = {k: v for k, v in feeds.items() if k in names}
        output = [session.get_outputs()[0].name]
        for _ in range(runs + 1):
            session.run(output, inputs)
        events = _node_events(session.end_profiling())
    # every call runs the same kernels, in order: drop the first (warm-up) call's share
    events = events[len(events) // (runs + 1):]
    time_by_op: Counter[str] = Counter()
    nodes_by_op: Counter[str] = Counter()
    for op, micros in events:
        time_by_op[op] += micros
        nodes_by_op[op] += 1
    total = sum(time_by_op.values()) or 1
    ops = [
        {"op": op, "ms_per_run": micros / runs / 1e3, "share": micros / total, "nodes": nodes_by_op[op] // runs}
        for op, micros in time_by_op.most_common()
    ]
    return {"runs": runs, "kernel_ms_per_run": total / runs / 1e3, "ops": ops}


def weight_gemm_floors(
    model_path: str | os.PathLike[str], tokens: Iterable[int], threads: int, **timing: Any
) -> dict[int, float]:
    """Median ms of the graph's fp32 weight GEMMs alone (:func:`~kvembed.bench.peak.weight_gemms_call`)
    at each token count: what a call of that many (padded) tokens would cost if all but its weight
    GEMMs were free. At few tokens that is reading every weight once, the floor a short input cannot
    go under with these kernels. One session at a time (each holds a copy of the fp32 weights);
    ``timing`` is :func:`~kvembed.bench.measure.time_calls`'s."""
    import statistics

    from .measure import time_calls
    from .peak import weight_gemms_call

    floors: dict[int, float] = {}
    for count in sorted(set(int(n) for n in tokens)):
        call, _ = weight_gemms_call(model_path, count, threads)
        floors[count] = 1e3 * float(statistics.median(time_calls(call, **timing)))
        del call
    return floors


def _node_events(path: str) -> list[tuple[str, int]]:
    """(op type, microseconds) of every kernel run recorded in an onnxruntime profile file."""
    events = json.loads(Path(path).read_text(encoding="utf-8"))
    return [
        (str(e["args"].get("op_name", "?")), int(e.get("dur", 0)))
        for e in events
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")
    ]
