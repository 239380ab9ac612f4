"""onnxruntime sessions: provider choice (CPU, CUDA, TensorRT), tuned options, IO binding.
(``"openvino"`` runs through :mod:`kvembed.runtime.openvino`, not onnxruntime.)

GPU paths are written against onnxruntime-gpu's real provider options and guarded: asking for
them where onnxruntime-gpu (or its CUDA/TensorRT libraries) is missing raises a RuntimeError that
names the fix, and ``"auto"`` falls back to the CPU.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnxruntime as ort

from ..errors import MissingDependency

PROVIDERS = ("auto", "cpu", "cuda", "tensorrt", "openvino")
GIB = 1024**3
#: resident bytes per byte of the artifact's graph files, onnxruntime on the CPU: fp16 weights are
#: cast to fp32 copies at load (its CPU provider has no fp16 MatMul); fp32 and int8 ones are packed
#: in place of the mapped file (benchmarks/load_memory.py)
CPU_WEIGHT_FACTOR = {"fp32": 1.0, "int8": 1.0, "fp16": 2.0}
#: OpenVINO: compiling from the ONNX holds the weights read and their converted copy at once; per
#: byte of fp32-equivalent weights (an fp16 file counts twice; an int8 one, not measured, four times)
OPENVINO_WEIGHT_FACTOR, FP32_EQUIVALENT = 2.5, {"fp32": 1.0, "fp16": 2.0, "int8": 4.0}
#: what a session holds beyond its weights after calls of the runtime's token budget
#: (CPU_CALL_TOKENS) at Qwen3-4B's widths: the arena's high-water mark, scratch, the interpreter
SESSION_OVERHEAD = 1.5 * GIB
CPU, CUDA, TENSORRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"


def provider_chain(
    provider: str = "auto",
    *,
    device_id: int = 0,
    trt_cache_dir: str | os.PathLike[str] | None = None,
    trt_fp16: bool = False,
) -> list[Any]:
    """The onnxruntime ``providers`` list for a kvembed provider name."""
    if provider not in PROVIDERS:
        raise ValueError(f"provider must be one of {', '.join(PROVIDERS)}, got {provider!r}")
    if provider == "openvino":
        raise ValueError("provider 'openvino' is not an onnxruntime provider: open it with Embedder.load(..., provider='openvino')")
    available = ort.get_available_providers()
    cuda = (CUDA, {"device_id": device_id})
    if provider == "cpu" or (provider == "auto" and CUDA not in available):
        return [CPU]
    if provider == "auto":
        return [cuda, CPU]
    needed = CUDA if provider == "cuda" else TENSORRT
    if needed not in available:
        raise MissingDependency(
            f"provider {provider!r} needs onnxruntime's {needed}, which this onnxruntime does not have "
            f"(available: {', '.join(available)}); install the GPU build: pip install 'kvembed[gpu]' "
            f"(onnxruntime-gpu, with CUDA{' and TensorRT' if provider == 'tensorrt' else ''} libraries)"
        )
    if provider == "cuda":
        return [cuda, CPU]
    trt_options = {
        "device_id": device_id,
        "trt_fp16_enable": bool(trt_fp16),
        "trt_engine_cache_enable": trt_cache_dir is not None,
    }
    if trt_cache_dir is not None:
        Path(trt_cache_dir).mkdir(parents=True, exist_ok=True)
        trt_options["trt_engine_cache_path"] = str(trt_cache_dir)
        trt_options["trt_timing_cache_enable"] = True
        trt_options["trt_timing_cache_path"] = str(trt_cache_dir)
    return [(TENSORRT, trt_options), cuda, CPU]


#: onnxruntime's session config key that turns weight pre-packing off
DISABLE_PREPACKING = "session.disable_prepacking"


def session_options(threads: int | None = None, memory_arena: bool = True, prepacking: bool = True) -> ort.SessionOptions:
    """Options tuned for embedding batches: full graph optimisation, sequential execution,
    ``threads`` intra-op threads (default: onnxruntime's choice, one per physical core).

    ``memory_arena``: on by default, the CPU arena keeps the activation memory of the largest call
    (rounded up) for the next ones, which makes calls faster, int8 ones most; calls are cut to the
    runtime's token budget, so what it keeps is bounded by the model's widths, not its weights.
    ``memory_arena=False`` gives activation memory back after every call instead (a 16 x 512 batch
    of the 8-layer 0.6B-shaped model: 2.6 GB kept vs 0.6 GB resident after the call;
    benchmarks/compare_graphs.py --memory), for servers that see rare large batches.

    ``prepacking``: on by default, each MatMul weight is packed once at load into the layout the
    GEMM kernel reads, replacing the memory-mapped weights tensor by tensor, so the peak is no
    higher and every call is faster (short queries most). ``prepacking=False``
    (``session.disable_prepacking``) keeps the weights as the pages of the artifact's external-data
    file, packing them during each call instead: slower calls and a near-instant load, and the
    weights are one copy shared by every process on the machine that maps the same file (several
    Ray actors, Triton instances or server processes) and reclaimable by the kernel.
    """
    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = bool(memory_arena)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_session_config_entry(DISABLE_PREPACKING, "0" if prepacking else "1")
    if threads is not None:
        if int(threads) < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        options.intra_op_num_threads = int(threads)
        options.inter_op_num_threads = 1
    return options


def create_session(
    model_path: str | os.PathLike[str],
    provider: str = "auto",
    threads: int | None = None,
    memory_arena: bool = True,
    prepacking: bool = True,
    **provider_options: Any,
) -> ort.InferenceSession:
    """A session of ``model_path`` on ``provider`` with :func:`session_options`."""
    providers = provider_chain(provider, **provider_options)
    options = session_options(threads, memory_arena, prepacking)
    return open_session(model_path, options, providers)


def session_memory(directory: str | os.PathLike[str], provider: str = "cpu") -> int:
    """Bytes of memory one loaded session of the artifact in ``directory`` holds at its peak, for
    schedulers that must not put more sessions on a machine than fit (Ray's ``memory``): its graph
    files' bytes times what the provider makes of them, plus :data:`SESSION_OVERHEAD`. GPU
    providers are counted as the CPU (what the host holds while the weights are loaded)."""
    from ..artifact import read_manifest

    path = Path(directory)
    precision = str(read_manifest(path).get("precision", "fp32"))
    graph = sum(p.stat().st_size for p in path.iterdir() if p.is_file() and p.name.startswith("model.onnx"))
    if provider == "openvino":
        factor = OPENVINO_WEIGHT_FACTOR * FP32_EQUIVALENT.get(precision, 4.0)
    else:
        factor = CPU_WEIGHT_FACTOR.get(precision, 2.0)
    return int(graph * factor + SESSION_OVERHEAD)


def open_session(model_path: str | os.PathLike[str], options: ort.SessionOptions, providers: Sequence[Any]) -> ort.InferenceSession:
    """``ort.InferenceSession``, with onnxruntime's load failures (a damaged or foreign file) turned
    into a ValueError naming the file: its pybind errors (InvalidProtobuf, Fail, ...) say neither."""
    try:
        return ort.InferenceSession(str(model_path), sess_options=options, providers=list(providers))
    except Exception as err:
        if not type(err).__module__.startswith("onnxruntime"):
            raise
        detail = " ".join(str(err).split())[:300]
        raise ValueError(
            f"onnxruntime cannot load {model_path} ({type(err).__name__}: {detail}); the file is damaged or "
            "not a kvembed graph: re-export the artifact"
        ) from err


def run_session(
    session: ort.InferenceSession, feeds: Mapping[str, np.ndarray], outputs: Sequence[str]
) -> list[np.ndarray]:
    """Run ``session``; on a GPU provider through IO binding (inputs copied once, outputs to host).
    OpenVINO and TensorRT-engine sessions (:mod:`~kvembed.runtime.openvino`,
    :mod:`~kvembed.runtime.engine`) have no IO binding and run directly."""
    if session.get_providers()[0] == CPU or not hasattr(session, "io_binding"):
        return session.run(list(outputs), dict(feeds))
    binding = session.io_binding()
    for name, array in feeds.items():
        binding.bind_cpu_input(name, np.ascontiguousarray(array))
    for name in outputs:
        binding.bind_output(name, "cpu")
    session.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()
