"""onnxruntime backend: provider choice (CPU, CUDA, TensorRT execution provider), tuned options, IO binding.
(``"openvino"`` runs through :mod:`kvembed.backends.openvino`, a TensorRT plan through
:mod:`kvembed.backends.tensorrt`, not onnxruntime.)

GPU paths are written against onnxruntime-gpu's real provider options and guarded: asking for
them where onnxruntime-gpu (or its CUDA/TensorRT libraries) is missing raises a RuntimeError that
names the fix, and ``"auto"`` falls back to the CPU. Both onnxruntime builds installed side by side
(:func:`wheel_clash`: the CPU one usually owns the module then) is a warning at load, with the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnxruntime as ort

from ..errors import InvalidInput, MissingDependency
from ..extras import install_hint

NAME = "onnxruntime"
#: the runtime provider names this backend serves (``"auto"``: CUDA when present, else the CPU)
ORT_PROVIDERS = ("auto", "cpu", "cuda", "tensorrt")
GIB = 1024**3
#: resident bytes per byte of the artifact's graph files on the CPU: fp16 weights are cast to fp32
#: copies at load (its CPU provider has no fp16 MatMul); fp32 and int8 ones are packed in place
#: of the mapped file (benchmarks/load_memory.py); a bf16 artifact holds the fp32 graph
CPU_WEIGHT_FACTOR = {"fp32": 1.0, "bf16": 1.0, "int8": 1.0, "fp16": 2.0}
CPU, CUDA, TENSORRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"
#: onnxruntime's execution providers by the runtime provider names they serve
EXECUTION_PROVIDERS = {CPU: "cpu", CUDA: "cuda", TENSORRT: "tensorrt"}
GPU_HINT = install_hint("gpu")
#: the two distributions that install the module ``onnxruntime``: the CPU build (kvembed's dependency)
#: and the GPU build; side by side, whichever was unpacked last owns the module's files
CPU_WHEEL, GPU_WHEEL = "onnxruntime", "onnxruntime-gpu"
#: the fix for both installed: the GPU build alone
ONE_WHEEL = f"pip uninstall -y {CPU_WHEEL} {GPU_WHEEL} && pip install {GPU_WHEEL}"


def wheel_clash() -> str | None:
    """Why this onnxruntime may not be the GPU build asked for, when both the ``onnxruntime`` and the
    ``onnxruntime-gpu`` distributions are installed (the ``gpu`` extra beside the core dependency),
    with the one-line fix; None when only one is."""
    from importlib import metadata

    try:
        for name in (CPU_WHEEL, GPU_WHEEL):
            metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    won = ("the CPU build's files won: no CUDA or TensorRT provider" if CUDA not in ort.get_available_providers()
           else "either one's reinstall can leave the CPU build in place")
    return f"{CPU_WHEEL} and {GPU_WHEEL} are both installed and share the module onnxruntime ({won}); fix: {ONE_WHEEL}"


@dataclass(frozen=True)
class OnnxRuntimeOptions:
    """How an onnxruntime session is made: ``Embedder.load(dir, options=OnnxRuntimeOptions(...))``.

    ``threads``: intra-op threads (None: one per physical core; ``Embedder.load``'s ``threads``
    fills it). ``memory_arena``: the CPU arena keeps the activation memory of the largest call for
    the next (False gives it back after every call, for long-lived processes whose inputs vary).
    ``prepacking``: MatMul weights are packed at load (False leaves them as the memory-mapped file,
    one copy shared by the processes that load it, slower calls). ``spinning``: intra-op threads
    spin between calls (off where other work shares the cores between calls, as in the export's
    parity gate). ``device_id``: the GPU of the CUDA and TensorRT execution providers.
    ``trt_cache_dir`` / ``trt_fp16``: the TensorRT execution provider's engine cache and fp16
    kernels."""

    threads: int | None = None
    memory_arena: bool = True
    prepacking: bool = True
    spinning: bool = True
    device_id: int = 0
    trt_cache_dir: str | os.PathLike[str] | None = None
    trt_fp16: bool = False


def probe(provider: str | None = None) -> str | None:
    """None for the CPU (onnxruntime is a dependency of kvembed, and its CPU provider is always
    there); for ``"cuda"`` or ``"tensorrt"``, :func:`provider_problem`."""
    return None if provider in (None, "auto", "cpu") else provider_problem(provider)


def provider_problem(provider: str) -> str | None:
    """Why onnxruntime's provider for ``provider`` (a runtime provider name) is absent here, or None."""
    available = ort.get_available_providers()
    if provider == "cuda" and CUDA not in available:
        return f"this onnxruntime has no CUDAExecutionProvider ({wheel_clash() or GPU_HINT})"
    if provider == "tensorrt" and TENSORRT not in available:
        fix = wheel_clash() or f"{GPU_HINT}, plus TensorRT's libraries from NVIDIA"
        return f"this onnxruntime has no TensorrtExecutionProvider ({fix})"
    return None


def provider_chain(
    provider: str = "auto",
    *,
    device_id: int = 0,
    trt_cache_dir: str | os.PathLike[str] | None = None,
    trt_fp16: bool = False,
) -> list[Any]:
    """The onnxruntime ``providers`` list for a kvembed provider name."""
    if provider not in ORT_PROVIDERS:  # another backend's provider, or none: the catalogue checks names
        raise InvalidInput(f"provider {provider!r} is not an onnxruntime provider ({', '.join(ORT_PROVIDERS)}); "
                           f"Embedder.load(..., provider={provider!r}) opens the backend that has it")
    available = ort.get_available_providers()
    cuda = (CUDA, {"device_id": device_id})
    if provider == "cpu" or (provider == "auto" and CUDA not in available):
        return [CPU]
    if provider == "auto":
        return [cuda, CPU]
    needed = CUDA if provider == "cuda" else TENSORRT
    clash = wheel_clash() if needed not in available else None
    if clash is not None:
        raise MissingDependency(f"provider {provider!r} needs onnxruntime's {needed}: {clash}")
    if needed not in available:
        raise MissingDependency(
            f"provider {provider!r} needs onnxruntime's {needed}, which this onnxruntime does not have "
            f"(available: {', '.join(available)}); install the GPU build: {GPU_HINT} "
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
#: onnxruntime's session config key that lets idle intra-op threads spin
ALLOW_SPINNING = "session.intra_op.allow_spinning"
#: onnxruntime's session config key for the arithmetic of the ``MatMulNBits`` it fuses from a weight-only
#: int8 graph's blocked ``DequantizeLinear -> MatMul`` (kvembed's int8 recipe ``weights``)
ACCURACY_LEVEL_KEY = "session.qdq_matmulnbits_accuracy_level"
#: the level every session of this backend pins, the parity gate's included, so the gate certifies
#: what runs: 1 = float32 arithmetic on the dequantised weights, whether the weights were pre-packed
#: or not. onnxruntime's default (4) quantises the activations to int8 inside the kernel, and only
#: where the weights were pre-packed, which the gate's session does not do.
WEIGHT_ONLY_ACCURACY = 1


def pin_weight_only(options: ort.SessionOptions) -> ort.SessionOptions:
    """``options`` with :data:`WEIGHT_ONLY_ACCURACY` pinned (it changes weight-only int8 graphs only),
    replacing any other level set before."""
    try:
        if options.get_session_config_entry(ACCURACY_LEVEL_KEY) == str(WEIGHT_ONLY_ACCURACY):
            return options
    except RuntimeError:  # not set yet
        pass
    options.add_session_config_entry(ACCURACY_LEVEL_KEY, str(WEIGHT_ONLY_ACCURACY))
    return options


def session_options(threads: int | None = None, memory_arena: bool = True, prepacking: bool = True,
                    spinning: bool = True) -> ort.SessionOptions:
    """Options tuned for embedding batches: full graph optimisation, sequential execution,
    ``threads`` intra-op threads (default: onnxruntime's choice, one per physical core).

    ``memory_arena``: on by default, the CPU arena keeps the activation memory of the largest call
    (rounded up) for the next ones, which makes calls faster, int8 ones most; calls are cut to the
    runtime's token budget, so what it keeps is bounded by the model's widths, not its weights.
    ``memory_arena=False`` gives activation memory back after every call instead, and plans no
    memory pattern per input shape (what each keeps: benchmarks/compare_graphs.py --memory), for
    servers that see rare large batches and for the parity gate, whose batches differ in shape.

    ``prepacking``: on by default, each MatMul weight is packed once at load into the layout the
    GEMM kernel reads, replacing the memory-mapped weights tensor by tensor, so the peak is no
    higher and every call is faster (short queries most). ``prepacking=False``
    (``session.disable_prepacking``) keeps the weights as the pages of the artifact's external-data
    file, packing them during each call instead: slower calls and a near-instant load, and the
    weights are one copy shared by every process on the machine that maps the same file (several
    Ray actors, Triton instances or server processes) and reclaimable by the kernel.

    ``spinning=False``: idle intra-op threads sleep instead of spinning for the next call.
    onnxruntime's warnings are off (errors still raise): kvembed reports what matters itself.
    """
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = bool(memory_arena)
    options.enable_mem_pattern = bool(memory_arena)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_session_config_entry(DISABLE_PREPACKING, "0" if prepacking else "1")
    if not spinning:
        options.add_session_config_entry(ALLOW_SPINNING, "0")
    pin_weight_only(options)
    if threads is not None:
        if int(threads) < 1:
            raise InvalidInput(f"threads must be >= 1, got {threads}")
        options.intra_op_num_threads = int(threads)
        options.inter_op_num_threads = 1
    return options


def create_session(
    model_path: str | os.PathLike[str],
    provider: str = "auto",
    threads: int | None = None,
    memory_arena: bool = True,
    prepacking: bool = True,
    spinning: bool = True,
    **provider_options: Any,
) -> ort.InferenceSession:
    """A plain ``ort.InferenceSession`` of ``model_path`` on ``provider`` with :func:`session_options`."""
    providers = provider_chain(provider, **provider_options)
    options = session_options(threads, memory_arena, prepacking, spinning)
    return open_session(model_path, options, providers)


def open_session(model_path: str | os.PathLike[str], options: ort.SessionOptions, providers: Sequence[Any]) -> ort.InferenceSession:
    """``ort.InferenceSession``, the one door to onnxruntime for the runtime and the parity gate:
    the weight-only arithmetic pinned (:func:`pin_weight_only`), and onnxruntime's load failures
    (a damaged or foreign file) turned into a ValueError naming the file: its pybind errors
    (InvalidProtobuf, Fail, ...) say neither."""
    pin_weight_only(options)
    try:
        return ort.InferenceSession(str(model_path), sess_options=options, providers=list(providers))
    except Exception as err:
        if not type(err).__module__.startswith("onnxruntime"):
            raise
        detail = " ".join(str(err).split())[:300]
        raise InvalidInput(
            f"onnxruntime cannot load {model_path} ({type(err).__name__}: {detail}); the file is damaged or "
            "not a kvembed graph: re-export the artifact"
        ) from err


def weight_factor(precision: str, options: OnnxRuntimeOptions | None = None) -> float:
    """Resident bytes per byte of graph file once loaded (:data:`CPU_WEIGHT_FACTOR`); GPU providers
    are counted as the CPU (what the host holds while the weights are loaded)."""
    return CPU_WEIGHT_FACTOR.get(precision, 2.0)


def load_warning(directory: Path, session: OnnxRuntimeSession, precision: str) -> str | None:
    """The caveat of both onnxruntime builds installed (:func:`wheel_clash`), then that of an fp16
    artifact on the CPU provider, which has no fp16 MatMul; or None."""
    caveats = [wheel_clash(), _fp16_caveat(directory, session, precision)]
    return "; also, ".join(c for c in caveats if c) or None


def _fp16_caveat(directory: Path, session: OnnxRuntimeSession, precision: str) -> str | None:
    if precision != "fp16" or session.providers[0] != CPU:
        return None
    return (f"{str(directory)!r} is an fp16 artifact on onnxruntime's CPU provider, which has no fp16 MatMul: it "
            "holds fp32 copies of the weights (twice the artifact's size) and runs at fp32 speed; "
            "provider='openvino' keeps them at two bytes where the CPU has FP16 (OpenVINOOptions(precision='f16')) or "
            "BF16 (precision='bf16', from a bf16 copy of the weights), and provider='auto' takes it once certified "
            "(kvembed verify DIR --record); elsewhere use the int8 or fp32 artifact")


class OnnxRuntimeSession:
    """An ``ort.InferenceSession`` behind the :class:`~kvembed.backends.protocol.Session` protocol.

    ``ort`` is the onnxruntime session itself; its own methods (``get_session_options``,
    ``get_providers``, ``get_inputs``, ...) stay reachable on this object, except ``run``, which
    takes the protocol's ``(feeds, output_names)``."""

    #: any shape; unit vectors come back from float32 arithmetic
    limits = None
    renormalise = False

    def __init__(self, session: ort.InferenceSession) -> None:
        self.ort = session
        self._inputs = [i.name for i in session.get_inputs()]

    def __getattr__(self, name: str) -> Any:
        if name == "ort":  # not set yet (unpickling, a failed __init__): no recursion
            raise AttributeError(name)
        return getattr(self.ort, name)

    @property
    def input_names(self) -> list[str]:
        return list(self._inputs)

    @property
    def providers(self) -> list[str]:
        return list(self.ort.get_providers())

    @property
    def name(self) -> str:
        """``onnxruntime-`` and the execution provider it runs on: ``cpu``, ``cuda``, ``tensorrt``."""
        first = self.ort.get_providers()[0]
        return f"{NAME}-{EXECUTION_PROVIDERS.get(first, first)}"

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        """Run; on a GPU provider through IO binding (inputs copied once, outputs to host)."""
        if self.ort.get_providers()[0] == CPU:
            return self.ort.run(list(output_names), dict(feeds))
        binding = self.ort.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name in output_names:
            binding.bind_output(name, "cpu")
        self.ort.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()


def open_graph(model_path: str | os.PathLike[str], provider: str = "auto", options: OnnxRuntimeOptions | None = None) -> OnnxRuntimeSession:
    """``model_path`` opened on ``provider`` (auto, cpu, cuda, tensorrt) with ``options``."""
    o = options or OnnxRuntimeOptions()
    provider_options: dict[str, Any] = {"device_id": o.device_id}
    if provider == "tensorrt":
        provider_options.update(trt_cache_dir=o.trt_cache_dir, trt_fp16=o.trt_fp16)
    return OnnxRuntimeSession(create_session(model_path, provider, o.threads, o.memory_arena, o.prepacking, o.spinning,
                                                **provider_options))
