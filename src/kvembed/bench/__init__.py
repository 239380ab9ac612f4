"""kvembed.bench: latency, throughput, memory and FLOP efficiency of an artifact vs PyTorch.

``kvembed bench`` exports (or takes) an artifact, builds inputs of exact token lengths, times the
onnxruntime graph and the PyTorch reference on the very same padded batches, each backend in a
process of its own (so peak RSS is its own), and writes ``results.json``, ``results.md`` and plots.

Importing this package never imports torch: the runtime-only path (``--artifact DIR --backends
runtime``) stays torch-free, and benchmark processes load only what they measure. Names load on
first use, so ``kvembed --help`` does not pay for numpy or onnxruntime.
"""

from ..lazy import lazy_exports

_EXPORTS = {
    "BenchConfig": "runner",
    "BenchProgress": "runner",
    "run_bench": "runner",
    "Timing": "measure",
    "time_calls": "measure",
    "build_random_model": "synthetic",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
