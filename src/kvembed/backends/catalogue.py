"""The backend catalogue: which backends kvembed has, whether each can run here (and why not), how
each opens an artifact's graph with its own options, and what ``"auto"`` picks.

Adding a backend is one file beside this one (``NAME``, ``probe()``, an options dataclass,
``open_graph(path, provider, options)``, ``weight_factor(precision)``) and one entry in
:data:`BACKENDS`; the runtime's provider names, ``kvembed verify --backends`` and the CLIs' help
texts are read from here. Backend modules are imported only when an entry is used, so reading the
names costs nothing (the CLIs build their help from them).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, Sequence

from ..artifact import MODEL, Certificate, Manifest, load_manifest, manifest_of, read_manifest
from ..artifact.certificates import precision_name
from .cpu import cpu_features
from .protocol import BackendUnavailableError, Session
from ..errors import InvalidInput
from ..extras import install_hint

__all__ = [
    "BACKENDS", "PROVIDERS", "PROVIDER_HELP", "VERIFY_BACKENDS", "VERIFY_ALIASES", "VERIFY_HELP", "REFERENCE_AUTO_LIMIT",
    "Backend", "BackendUnavailableError", "Choice", "VerifyTarget", "backend_for", "choose_backend", "open_session", "options_for",
    "provider_problem", "resolve_verify_backends", "session_memory", "verify_problems",
]


@dataclass(frozen=True)
class Backend:
    """One backend: its module in this room, its options dataclass and the runtime providers it serves."""

    name: str
    module: str
    options: str
    providers: tuple[str, ...]

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)

    def probe(self) -> str | None:
        """None when this backend can run here, else why not (and what to install)."""
        return self.load().probe()

    def options_type(self) -> type:
        return getattr(self.load(), self.options)


#: every backend, by name; ``tensorrt`` runs engine directories (``kvembed build-engine``)
BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("onnxruntime", "kvembed.backends.onnxruntime", "OnnxRuntimeOptions", ("cpu", "cuda", "tensorrt")),
    Backend("openvino", "kvembed.backends.openvino", "OpenVINOOptions", ("openvino",)),
    Backend("tensorrt", "kvembed.backends.tensorrt", "TensorRTOptions", ("tensorrt",)),
)}

#: the runtime's provider names (``Embedder.load(provider=...)``, every CLI's ``--provider``).
#: ``"auto"``: :func:`choose_backend` (an engine directory's plan on TensorRT; a bf16 artifact
#: certified on OpenVINO at bf16 on OpenVINO's CPU plugin where the CPU has BF16; else onnxruntime,
#: on CUDA when onnxruntime-gpu sees a GPU and on the CPU otherwise)
PROVIDERS: tuple[str, ...] = ("auto", *dict.fromkeys(p for b in BACKENDS.values() for p in b.providers))
#: the provider names as the CLIs' ``--provider`` help lists them
PROVIDER_HELP = ", ".join(PROVIDERS)
#: the flat keywords of ``Embedder.load`` and the option field each becomes, per backend
FLAT_KEYWORDS: dict[str, dict[str, str]] = {
    "onnxruntime": {"threads": "threads", "memory_arena": "memory_arena", "prepacking": "prepacking",
                    "device_id": "device_id", "trt_cache_dir": "trt_cache_dir", "trt_fp16": "trt_fp16"},
    "openvino": {"threads": "threads", "ov_precision": "precision", "ov_cache_dir": "cache_dir"},
    "tensorrt": {},
}
#: their defaults (a keyword at its default was not asked for)
FLAT_DEFAULTS: dict[str, Any] = {
    "threads": None, "device_id": 0, "trt_cache_dir": None, "trt_fp16": False, "memory_arena": True,
    "prepacking": True, "ov_precision": None, "ov_cache_dir": None,
}
#: what a session holds beyond its weights after calls of the runtime's CPU token budget at a
#: mid-sized LLM's widths: the arena's high-water mark, scratch, the interpreter
SESSION_OVERHEAD = int(1.5 * 1024**3)


def _is_engine_dir(directory: Path) -> bool:
    from .tensorrt import is_engine_dir

    return is_engine_dir(directory)


def check_provider(provider: str) -> None:
    """A ValueError naming the valid providers, for a name that is not one."""
    if provider not in PROVIDERS:
        raise InvalidInput(f"provider must be one of {', '.join(PROVIDERS)}, got {provider!r}")


def backend_for(directory: str | os.PathLike[str], provider: str = "auto") -> str:
    """The backend that opens ``directory`` for ``provider``: an engine directory's plan runs on
    ``tensorrt`` (provider auto or tensorrt only), ``openvino`` on OpenVINO, the rest on onnxruntime."""
    check_provider(provider)
    path = Path(directory)
    if _is_engine_dir(path):
        if provider not in ("auto", "tensorrt"):
            raise InvalidInput(
                f"{str(path)!r} is a TensorRT engine directory: it runs with provider 'tensorrt' (or 'auto'); "
                f"for provider {provider!r} load the artifact it was built from"
            )
        return "tensorrt"
    return "openvino" if provider == "openvino" else "onnxruntime"


def options_for(backend: str, options: Any = None, **flat: Any) -> Any:
    """The options ``backend`` opens a graph with: ``options`` (its dataclass) as given, or built
    from ``Embedder.load``'s flat keywords (those that do not apply to ``backend`` are ignored, as
    they always were). Both at once is an error: one would silently lose."""
    unknown = set(flat) - set(FLAT_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown backend option{'s' if len(unknown) > 1 else ''}: {', '.join(sorted(unknown))}")
    kind = BACKENDS[backend].options_type()
    if options is not None:
        if not isinstance(options, kind):
            raise InvalidInput(f"backend {backend!r} takes {kind.__name__}, got {type(options).__name__}")
        given = sorted(k for k, v in flat.items() if v != FLAT_DEFAULTS[k])
        if given:
            raise InvalidInput(f"pass either options= or {', '.join(given)}, not both")
        return options
    fields = {field: flat[key] for key, field in FLAT_KEYWORDS[backend].items() if key in flat}
    return kind(**fields)


@dataclass(frozen=True)
class Choice:
    """Where a provider name runs an artifact, and why: the backend, the provider its session is
    opened with, the OpenVINO precision hint the choice fixes (``auto``'s bf16), one line of
    reason, and the certificate it relied on."""

    backend: str
    provider: str
    ov_precision: str | None = None
    reason: str = ""
    certificate: Certificate | None = None
    auto: bool = False


#: artifact precision -> what ``auto`` says when it keeps the artifact on onnxruntime instead of
#: the certified OpenVINO path
_ONNXRUNTIME_INSTEAD = {
    "bf16": "runs its fp32 graph on onnxruntime instead (as accurate as bf16 or more, slower)",
    "int8": "runs its integer graph on onnxruntime instead",
    "fp16": "runs on onnxruntime instead (on a CPU: fp32 copies of its weights, twice the memory)",
}
#: artifact precision -> the OpenVINO hints ``auto`` runs it with where certified, preferred first:
#: bf16 arithmetic for the fp32 graph (bf16) and int8's dequantised weights; an fp16 artifact's
#: weights kept fp16 (f16, a CPU with FP16) or retyped to bf16 (a CPU with BF16: :func:`.openvino.write_bf16_graph`)
_OPENVINO_HINTS = {"bf16": ("bf16",), "int8": ("bf16",), "fp16": ("f16", "bf16")}


def choose_backend(
    directory: str | os.PathLike[str], provider: str = "auto", manifest: Manifest | None = None,
    options: Any = None,
) -> Choice:
    """The one decision of what ``provider`` runs the artifact (or engine directory) ``directory``
    on: every loader (``Embedder.load``, serve, Triton's python model, corpus jobs, eval, bench)
    goes through it. A named provider is taken as asked. ``auto`` never picks an uncertified path:

    - an engine directory: its plan on TensorRT;
    - a bf16 artifact with a certificate of OpenVINO running bf16 against PyTorch within bf16's bar
      (:meth:`~kvembed.artifact.Manifest.certificate`), or an int8 artifact with one of OpenVINO
      running its OpenVINO graph in bf16 within int8's bar, on a CPU with BF16
      (:func:`~kvembed.backends.cpu.cpu_features`) where openvino is installed: OpenVINO, bf16 hint;
    - an fp16 artifact with a certificate of OpenVINO running it in fp16 within fp16's bar, on a CPU
      with FP16, where openvino is installed: OpenVINO, f16 hint (its weights stay fp16, where
      onnxruntime's CPU provider holds fp32 copies); else, with one of OpenVINO running it in bf16
      within fp16's bar, on a CPU with BF16: OpenVINO, bf16 hint (its weights retyped to bf16, two
      bytes each);
    - otherwise onnxruntime, exactly as before certificates existed (CUDA when onnxruntime-gpu sees
      a GPU, else the CPU): a bf16 artifact's graph is the fp32 one, which its gate also certified
      on onnxruntime, and the reason says why bf16 was not taken.

    ``options`` (a backend's options dataclass given with ``auto``) keeps ``auto`` on onnxruntime
    unless it is OpenVINO's and OpenVINO is the pick: options are never silently dropped.
    ``manifest``: the artifact's, as the caller loaded it (read here only when not given).
    """
    check_provider(provider)
    path = Path(directory)
    if provider != "auto" or _is_engine_dir(path):
        backend = backend_for(path, provider)
        why = "a TensorRT engine directory" if backend == "tensorrt" and provider == "auto" else f"provider {provider!r} asked for"
        return Choice(backend, provider, reason=why, auto=provider == "auto")
    typed = load_manifest(path) if manifest is None else manifest
    kind = typed.precision
    if kind not in _ONNXRUNTIME_INSTEAD or (kind == "int8" and "openvino" not in typed.graphs):
        return Choice("onnxruntime", "auto", reason=f"{kind} artifact: onnxruntime", auto=True)
    instead = _ONNXRUNTIME_INSTEAD[kind]
    hints = _OPENVINO_HINTS[kind]
    features = cpu_features()
    certified = [(hint, found) for hint in hints if (found := typed.certificate("openvino", precision_name(hint), bar=kind))]
    if not certified:
        ran = " or ".join(precision_name(hint) for hint in hints)
        why = (f"no certificate of OpenVINO running {ran} (kvembed verify DIR --record on a CPU with "
               f"{' or '.join(precision_name(hint).upper() for hint in hints)} adds one)"
               if not any(c.backend == "openvino" for c in typed.certified) else
               f"certified on OpenVINO only where {ran} did not run (" +
               "; ".join(c.describe() for c in typed.certified if c.backend == "openvino") + ")")
        return Choice("onnxruntime", "auto", reason=f"{kind} artifact, {why}: {instead}", auto=True)
    hint, certificate = next(((h, c) for h, c in certified if features.runs(h)), certified[0])
    described = features.describe_hint(hint)
    if not features.runs(hint):
        return Choice("onnxruntime", "auto", reason=f"{kind} artifact, this CPU has {described}: {instead}",
                      certificate=certificate, auto=True)
    problem = BACKENDS["openvino"].probe()
    if problem is not None:
        return Choice("onnxruntime", "auto", reason=f"{kind} artifact, {problem}: {instead}", certificate=certificate, auto=True)
    if options is not None and not isinstance(options, BACKENDS["openvino"].options_type()):
        return Choice("onnxruntime", "auto", reason=f"{kind} artifact, options= are {type(options).__name__}: {instead}",
                      certificate=certificate, auto=True)
    return Choice("openvino", "openvino", hint, auto=True, certificate=certificate,
                  reason=f"{kind} artifact certified on OpenVINO ({certificate.describe()}), this CPU has {described}")


def open_session(directory: str | os.PathLike[str], provider: str = "auto", options: Any = None,
                 choice: Choice | None = None, manifest: Manifest | None = None) -> Session:
    """The graph of the artifact (or engine directory) ``directory`` opened where ``choice``
    (default: :func:`choose_backend` for ``provider`` and ``options``) runs it: the graph file the
    manifest names for that backend (:meth:`~kvembed.artifact.Manifest.graph_file`). ``manifest``:
    the artifact's, as the caller loaded it (read here only when not given)."""
    path = Path(directory)
    choice = choice or choose_backend(path, provider, manifest, options=options)
    forced = {"ov_precision": choice.ov_precision} if choice.ov_precision and options is None else {}
    options = options_for(choice.backend, options, **forced)
    if choice.backend == "tensorrt":
        target = path
    else:
        target = path / (manifest if manifest is not None else load_manifest(path)).graph_file(choice.backend)
    return BACKENDS[choice.backend].load().open_graph(target, choice.provider, options)


def provider_problem(provider: str) -> str | None:
    """Why the runtime provider ``provider`` cannot run here, or None (``auto`` always can: it falls back to the CPU)."""
    check_provider(provider)
    if provider == "openvino":
        return BACKENDS["openvino"].probe()
    if provider in ("cuda", "tensorrt"):
        from .onnxruntime import provider_problem as ort_problem

        return ort_problem(provider)
    return None


def session_memory(artifact: Manifest | str | os.PathLike[str], provider: str = "cpu") -> int:
    """Bytes of memory one loaded session of ``artifact`` (its manifest or directory) holds at its peak, for
    schedulers that must not put more sessions on a machine than fit (Ray's ``memory``): its graph
    files' bytes times what the backend makes of them (its ``weight_factor``), plus
    :data:`SESSION_OVERHEAD`. GPU providers are counted as the CPU (what the host holds while the
    weights are loaded)."""
    manifest = manifest_of(artifact)
    path, precision = manifest.artifact_directory(), manifest.precision
    graph = sum(p.stat().st_size for p in path.iterdir() if p.is_file() and p.name.startswith(MODEL))
    choice = choose_backend(path, provider, manifest)
    if choice.backend == "openvino":
        factor = BACKENDS["openvino"].load().weight_factor(precision, choice.ov_precision)
    else:
        factor = BACKENDS["onnxruntime"].load().weight_factor(precision)
    return int(graph * factor + SESSION_OVERHEAD)


# -- kvembed verify --backends: the same graph on every backend present ---------------------------


@dataclass(frozen=True)
class VerifyTarget:
    """One thing ``kvembed verify --backends`` runs a graph on: a backend with one setting
    (onnxruntime's provider, OpenVINO's precision hint), or ONNX's reference evaluator."""

    name: str
    backend: str
    setting: str = ""

    def problem(self) -> str | None:
        """Why this target cannot run here, or None."""
        if self.backend == "onnx-reference":
            return reference_problem()
        if self.backend == "onnxruntime":
            return provider_problem(self.setting)
        return BACKENDS[self.backend].probe()


CPU, CUDA, ORT_TENSORRT, TENSORRT, OV_F32, OV_BF16, OV_F16, REFERENCE = (
    "onnxruntime-cpu", "onnxruntime-cuda", "onnxruntime-tensorrt", "tensorrt", "openvino-f32", "openvino-bf16",
    "openvino-f16", "onnx-reference",
)
#: every verify target, in the order they are run and reported (the first is the baseline)
VERIFY_TARGETS: dict[str, VerifyTarget] = {t.name: t for t in (
    VerifyTarget(CPU, "onnxruntime", "cpu"),
    VerifyTarget(CUDA, "onnxruntime", "cuda"),
    VerifyTarget(ORT_TENSORRT, "onnxruntime", "tensorrt"),
    VerifyTarget(TENSORRT, "tensorrt"),
    VerifyTarget(OV_F32, "openvino", "f32"),
    VerifyTarget(OV_BF16, "openvino", "bf16"),
    VerifyTarget(OV_F16, "openvino", "f16"),
    VerifyTarget(REFERENCE, "onnx-reference"),
)}
VERIFY_BACKENDS: tuple[str, ...] = tuple(VERIFY_TARGETS)
#: names that stand for several targets
VERIFY_ALIASES: dict[str, tuple[str, ...]] = {"openvino": (OV_F32, OV_BF16, OV_F16)}
#: ``auto`` offers onnx-reference only below this model size (model.onnx + external data): pure Python is slow
REFERENCE_AUTO_LIMIT = 50 * 1024 * 1024
#: ``kvembed verify --backends`` help
VERIFY_HELP = (
    "Backends to compare the graph on, comma-separated: auto (every backend present; onnx-reference only for "
    f"models under {REFERENCE_AUTO_LIMIT // 1024 // 1024} MB) or names from {', '.join(VERIFY_BACKENDS[:-1])} "
    f"(openvino: all three), {REFERENCE} (e.g. 'auto,{REFERENCE}'); each is compared with {CPU}."
)


def reference_problem() -> str | None:
    """Why ONNX's reference evaluator cannot run here, or None."""
    try:
        importlib.import_module("onnx.reference")
    except ImportError:
        return f"onnx is not installed ({install_hint('export')})"
    return None


def cpu_has_bf16() -> bool:
    return cpu_features().bf16


def model_bytes(path: str | os.PathLike[str]) -> int:
    """Size of an ONNX file plus its external data (``model.onnx.data``) if any."""
    path = Path(path)
    data = path.with_name(path.name + ".data")
    return sum(p.stat().st_size for p in (path, data) if p.is_file())


def _mb(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MB" if n < 1024 ** 3 else f"{n / 1024 ** 3:.1f} GB"


def verify_problems(manifest: Mapping[str, Any] | None = None) -> dict[str, str]:
    """``name -> why it cannot run here`` for every verify target this machine (or this artifact's
    graph: TensorRT's parser takes no int8 one) lacks; absent ones only."""
    problems = {name: why for name, target in VERIFY_TARGETS.items() if (why := target.problem()) is not None}
    graph = (manifest or {}).get("graph", {})
    if TENSORRT not in problems and graph and not graph.get("tensorrt_ready", True):
        ops = ", ".join(graph.get("non_portable_ops", [])) or "non-portable ops"
        problems[TENSORRT] = f"TensorRT's parser does not take this graph ({ops}); export fp32 or fp16 for TensorRT"
    return problems


def resolve_verify_backends(
    directory: str | os.PathLike[str] | None = None,
    backends: str | Sequence[str] = "auto",
    *,
    manifest: Mapping[str, Any] | None = None,
    model_path: str | os.PathLike[str] | None = None,
    problems: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The targets to compare and ``{skipped target: reason}``.

    ``backends`` is ``"auto"`` (every present target; onnx-reference only for models under
    :data:`REFERENCE_AUTO_LIMIT`), a comma list of names, or a sequence; ``auto`` may be combined
    with names (``"auto,onnx-reference"``). Unknown names raise ValueError naming the valid ones; a
    target asked for by name that this machine lacks raises :class:`BackendUnavailableError`
    saying what to install. Skipped targets (with reasons) are reported only for ``auto``.
    ``problems``: what is absent (default :func:`verify_problems`).
    """
    if directory is not None:
        manifest = read_manifest(directory) if manifest is None else manifest
        model_path = Path(directory) / MODEL if model_path is None else model_path
    if model_path is None:
        raise InvalidInput("give an artifact directory or a model path")
    names = [n.strip().lower() for n in (backends.split(",") if isinstance(backends, str) else backends)]
    names = [n for n in names if n]
    if not names:
        raise InvalidInput(f"--backends is empty; give 'auto' or a comma list of {', '.join(VERIFY_BACKENDS)}")
    unknown = [n for n in names if n != "auto" and n not in VERIFY_TARGETS and n not in VERIFY_ALIASES]
    if unknown:
        raise InvalidInput(
            f"unknown backend{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"valid: auto, {', '.join(VERIFY_BACKENDS)}, {', '.join(VERIFY_ALIASES)}"
        )
    names = [member for n in names for member in VERIFY_ALIASES.get(n, (n,))]
    problems = verify_problems(manifest) if problems is None else dict(problems)
    chosen: set[str] = set()
    skipped: dict[str, str] = {}
    if "auto" in names:
        size = model_bytes(model_path)
        features = cpu_features()
        for name in VERIFY_BACKENDS:
            if name in problems:
                skipped[name] = problems[name]
            elif name == REFERENCE and size >= REFERENCE_AUTO_LIMIT and REFERENCE not in names:
                skipped[name] = (
                    f"model is {_mb(size)} (auto takes it below {_mb(REFERENCE_AUTO_LIMIT)}: pure Python is slow); "
                    f"ask for it with --backends auto,{REFERENCE}"
                )
            elif VERIFY_TARGETS[name].backend == "openvino" and name not in names and not features.runs(VERIFY_TARGETS[name].setting):
                skipped[name] = (f"this CPU has {features.describe_hint(VERIFY_TARGETS[name].setting)}: OpenVINO would "
                                 f"run f32 again; ask for it with --backends auto,{name}")
            else:
                chosen.add(name)
    for name in names:
        if name == "auto":
            continue
        if name in problems:
            raise BackendUnavailableError(f"backend {name} is not available here: {problems[name]}")
        chosen.add(name)
        skipped.pop(name, None)
    if CPU not in problems:  # the baseline every target is compared with, asked for or not
        chosen.add(CPU)
    return [name for name in VERIFY_BACKENDS if name in chosen], skipped
