"""The backend catalogue: which backends kvembed has, whether each can run here (and why not), how
each opens an artifact's graph with its own options, and what ``"auto"`` picks.

Adding a backend is one file beside this one (a :class:`~kvembed.backends.protocol.BackendModule`:
``NAME``, ``probe()``, an options dataclass, ``open_graph(path, provider, options)`` returning a
:class:`~kvembed.backends.protocol.Session`, ``weight_factor(precision, options)``), one entry in
:data:`BACKENDS`, and its targets in :mod:`.targets`. This module and :mod:`.targets` are the
registry: nothing outside ``backends/`` imports a backend's file (a caller that needs one of its
functions takes the module from its entry, ``BACKENDS[name].load()``). Backend modules are
imported only when an entry is used, so reading the names costs nothing (the CLIs build their help
from them).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ..artifact import MODEL, Certificate, Manifest, check_intact, load_manifest, manifest_of
from ..artifact.certificates import precision_name
from ..artifact.engine import CLAIMED
from .cpu import HINT_NEEDS, cpu_features
from .protocol import BackendUnavailableError, Session
from .targets import (
    CPU, CUDA, PROVIDER_HELP, PROVIDER_TARGETS, PROVIDERS, REFERENCE_BACKEND, TARGETS, check_provider, openvino_target,
    providers, reference_problem,
)
from ..errors import InvalidInput
from ..status import waiting

__all__ = [
    "BACKENDS", "PROVIDERS", "PROVIDER_HELP", "Backend", "BackendUnavailableError", "Choice", "backend_for",
    "backend_options", "check_provider", "choose_backend", "given_options", "hint_options", "providers", "load_warning", "open_session",
    "open_artifact", "open_target", "options_for", "provider_problem", "removed_keyword", "session_backend", "session_memory",
    "target_problem", "verify_files",
]

@dataclass(frozen=True)
class Backend:
    """One catalogue entry: the backend's module in this room and its options dataclass; its
    targets (:data:`~.targets.TARGETS`) say which runtime providers it serves."""

    name: str
    module: str
    options: str

    @property
    def providers(self) -> tuple[str, ...]:
        """The runtime provider names with a target on this backend (:data:`~.targets.PROVIDER_TARGETS`)."""
        return tuple(p for p, names in PROVIDER_TARGETS.items() if any(TARGETS[t].backend == self.name for t in names))

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)

    def probe(self, provider: str | None = None) -> str | None:
        """None when this backend (for the runtime provider ``provider``, if given) can run here,
        else why not (and what to install)."""
        return self.load().probe(provider)

    def options_type(self) -> type:
        return getattr(self.load(), self.options)

    def claims(self, directory: Path) -> bool:
        """Whether ``directory`` is this backend's own format (a TensorRT engine directory), which
        runs nowhere else; backends without a ``claims`` run artifacts."""
        claims = getattr(self.load(), "claims", None)
        return claims is not None and bool(claims(directory))

    @property
    def opens_directories(self) -> bool:
        return hasattr(self.load(), "claims")


#: every backend, by name; ``tensorrt`` runs engine directories (``kvembed build-engine``)
BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("onnxruntime", "kvembed.backends.onnxruntime", "OnnxRuntimeOptions"),
    Backend("openvino", "kvembed.backends.openvino", "OpenVINOOptions"),
    Backend("tensorrt", "kvembed.backends.tensorrt", "TensorRTOptions"),
)}
#: what a session holds beyond its weights after calls of the runtime's CPU token budget at a
#: mid-sized LLM's widths: the arena's high-water mark, scratch, the interpreter
SESSION_OVERHEAD = int(1.5 * 1024**3)


def _claimant(directory: Path) -> Backend | None:
    """The backend whose own format ``directory`` is, or None (an artifact)."""
    return next((b for b in BACKENDS.values() if b.claims(directory)), None)


def backend_for(directory: str | os.PathLike[str], provider: str = "auto") -> str:
    """The backend that opens ``directory`` for ``provider``: a directory in a backend's own format
    (a TensorRT engine directory) runs on that backend (provider auto or one it serves only), an
    artifact on the first entry serving ``provider`` that runs artifacts (auto: the first of them)."""
    check_provider(provider)
    path = Path(directory)
    owner = _claimant(path)
    if owner is not None:
        if provider not in ("auto", *owner.providers):
            served = " or ".join(repr(p) for p in owner.providers)
            raise InvalidInput(
                f"{str(path)!r} is {CLAIMED}: it runs with provider {served} (or 'auto'); "
                f"for provider {provider!r} load the artifact it was built from"
            )
        return owner.name
    runs_artifacts = [b for b in BACKENDS.values() if not b.opens_directories]
    if provider == "auto":
        return runs_artifacts[0].name
    found = next((b for b in runs_artifacts if provider in b.providers), None)
    if found is None:
        raise InvalidInput(f"provider {provider!r} runs only directories of its own format, not the artifact {str(path)!r}")
    return found.name


#: what ``options=`` may be: one backend's options dataclass, or several (at most one per backend)
Options = Any


def given_options(options: Options = None) -> dict[str, Any]:
    """``options`` by backend name: one backend's options dataclass (``OpenVINOOptions(...)``), or a
    sequence of them for ``auto`` (each backend it may pick takes its own); None is none. Anything
    else, or two for one backend, is one line saying what is taken."""
    if options is None:
        return {}
    items = list(options) if isinstance(options, (list, tuple)) else [options]
    kinds = {name: entry.options_type() for name, entry in BACKENDS.items()}
    found: dict[str, Any] = {}
    for item in items:
        name = next((n for n, kind in kinds.items() if isinstance(item, kind)), None)
        if name is None:
            takes = ", ".join(kind.__name__ for kind in kinds.values())
            raise InvalidInput(f"options= takes a backend's options ({takes}) or a list of them, got {type(item).__name__}")
        if name in found:
            raise InvalidInput(f"options= has two {type(item).__name__}: give one per backend")
        found[name] = item
    return found


def options_for(backend: str, options: Options = None, threads: int | None = None) -> Any:
    """The options ``backend`` opens a graph with: its own dataclass among ``options``
    (:func:`given_options`), else its defaults; ``threads`` (the one setting every backend has)
    fills its ``threads`` field. One dataclass of another backend is an error (it would silently do
    nothing); a list is per backend, each taken where that backend runs (the others' defaults
    elsewhere), as ``auto`` may pick any of them."""
    given = given_options(options)
    kind = BACKENDS[backend].options_type()
    if given and backend not in given and not isinstance(options, (list, tuple)):
        names = ", ".join(type(o).__name__ for o in given.values())
        raise InvalidInput(f"backend {backend!r} takes {kind.__name__}, got {names}")
    built = given.get(backend) or kind()
    if threads is not None and any(f.name == "threads" for f in dataclasses.fields(kind)):
        if built.threads not in (None, threads):
            raise InvalidInput(f"threads={threads} and {kind.__name__}(threads={built.threads}): give it once")
        built = dataclasses.replace(built, threads=threads)
    return built


def hint_options(ov_precision: str | None) -> Any:
    """OpenVINO's options for the CLIs' ``--ov-precision`` (None: no hint given, no options)."""
    return None if ov_precision is None else BACKENDS["openvino"].options_type()(precision=ov_precision)


def removed_keyword(keyword: str) -> str:
    """What a flat backend keyword of an older ``Embedder.load`` (``ov_precision=``,
    ``memory_arena=``) is now: the options dataclass field that holds it, as one line."""
    for entry in BACKENDS.values():
        kind = entry.options_type()
        for name in (keyword, keyword.removeprefix("ov_")):
            if any(f.name == name for f in dataclasses.fields(kind)) and (name == keyword or entry.name == "openvino"):
                return (f"Embedder.load() takes backend options as options={kind.__name__}({name}=...) "
                        f"(from kvembed import {kind.__name__}), not {keyword}=")
    return f"Embedder.load() got an unexpected keyword argument {keyword!r}"


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

    @property
    def target(self) -> str:
        """The target this choice opens (:func:`target_of`); the session's ``name`` is what ran."""
        return target_of(self.backend, self.provider, self.ov_precision)


def target_of(backend: str, provider: str, ov_precision: str | None = None) -> str:
    """The target ``backend`` opens for runtime ``provider``: onnxruntime's execution provider
    (``auto``: CUDA where this onnxruntime has it, else the CPU), OpenVINO's precision hint as it
    runs on this CPU (None: the CPU's default); another backend's first target (TensorRT's plan)."""
    if backend == "onnxruntime":
        if provider == "auto":
            return CUDA if BACKENDS[backend].probe("cuda") is None else CPU
        return f"{backend}-{provider}"
    if backend == "openvino":  # a hint OpenVINO has no target for is the session's to refuse, with its own message
        hint = BACKENDS[backend].load().hint_for(ov_precision)
        return openvino_target(hint) if f"openvino-{hint}" in TARGETS else backend
    return next((t.name for t in TARGETS.values() if t.backend == backend), backend)


def open_target(target: str, path: str | os.PathLike[str], options: Options = None, threads: int | None = None) -> Session:
    """The graph file ``path`` opened on ``target`` (:data:`~.targets.TARGETS`) with its backend's
    ``options`` (:func:`options_for`) and the target's setting: onnxruntime's
    provider, OpenVINO's precision hint. What the parity gate and verify open; the runtime opens
    through :func:`open_session`, which also reads the manifest's graph file."""
    spec = TARGETS.get(target)
    if spec is None or spec.backend not in BACKENDS:
        raise InvalidInput(f"no backend opens target {target!r}; one of {', '.join(t for t in TARGETS if TARGETS[t].backend in BACKENDS)}")
    built = options_for(spec.backend, options, threads)
    if spec.backend == "openvino":
        built = dataclasses.replace(built, precision=spec.setting)
    provider = spec.setting if spec.backend == "onnxruntime" else spec.backend
    return BACKENDS[spec.backend].load().open_graph(path, provider, built)


#: artifact precision -> what ``auto`` says when it keeps the artifact on onnxruntime instead of
#: the certified OpenVINO path
_ONNXRUNTIME_INSTEAD = {
    "bf16": "runs its fp32 graph on onnxruntime instead (as accurate as bf16 or more, slower)",
    "int8": "runs on onnxruntime instead",
    "fp16": "runs on onnxruntime instead (on a CPU: fp32 copies of its weights, twice the memory)",
}
#: artifact precision -> the OpenVINO hints ``auto`` runs it with where certified, the more precise
#: first among those this CPU runs equally fast (:meth:`~.cpu.CpuFeatures.fastest_first` orders
#: them): bf16 arithmetic for the fp32 graph (bf16) and int8's dequantised weights, or f32
#: arithmetic on int8 weights (the export certifies that only for a weight-only graph, which
#: onnxruntime's CPU provider runs slower); an fp16 artifact's weights kept fp16 (f16, a CPU with
#: FP16) or its GEMM weights retyped to bf16 (a CPU with BF16: :func:`.openvino.write_bf16_graph`)
_OPENVINO_HINTS = {"bf16": ("bf16",), "int8": ("bf16", "f32"), "fp16": ("f16", "bf16")}


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
      else, an int8 artifact with one of OpenVINO running it in f32 within int8's bar (a
      weight-only graph): OpenVINO, f32 hint;
    - an fp16 artifact with a certificate of OpenVINO running it within fp16's bar in fp16 (on a
      CPU with FP16: its weights stay fp16, where onnxruntime's CPU provider holds fp32 copies) or
      in bf16 (on a CPU with BF16: its GEMM weights retyped to bf16, two bytes each), where openvino is
      installed: OpenVINO, the certified hint this CPU runs fastest (AMX tiles before vector
      units: bf16 on a CPU with AMX-BF16 but not AMX-FP16), f16 where both run alike;
    - otherwise onnxruntime, exactly as before certificates existed (CUDA when onnxruntime-gpu sees
      a GPU, else the CPU): a bf16 artifact's graph is the fp32 one, which its gate also certified
      on onnxruntime, and the reason says why bf16 was not taken.

    ``options`` given with ``auto`` as one dataclass of another backend keeps ``auto`` on
    onnxruntime (options are never silently dropped); a list (:func:`given_options`) leaves the
    pick free.
    ``manifest``: the artifact's, as the caller loaded it (read here only when not given).
    """
    check_provider(provider)
    path = Path(directory)
    owner = _claimant(path)
    if provider != "auto" or owner is not None:
        backend = backend_for(path, provider)
        why = CLAIMED if owner is not None and provider == "auto" else f"provider {provider!r} asked for"
        return Choice(backend, provider, reason=why, auto=provider == "auto")
    typed = load_manifest(path) if manifest is None else manifest
    kind = typed.precision
    if kind not in _ONNXRUNTIME_INSTEAD or (kind == "int8" and "openvino" not in typed.graphs):
        return Choice("onnxruntime", "auto", reason=f"{kind} artifact: onnxruntime", auto=True)
    instead = _ONNXRUNTIME_INSTEAD[kind]
    features = cpu_features()
    hints = features.fastest_first(_OPENVINO_HINTS[kind])
    certified = [(hint, found) for hint in hints if (found := typed.certificate("openvino", precision_name(hint), bar=kind))]
    if not certified:
        ran = " or ".join(precision_name(hint) for hint in hints)
        # a hint every CPU runs (f32) can be certified anywhere
        where = "" if any(h not in HINT_NEEDS for h in hints) else " or ".join(precision_name(h).upper() for h in hints)
        why = (f"no certificate of OpenVINO running {ran} (kvembed verify DIR --record"
               f"{f' on a CPU with {where}' if where else ''} adds one)"
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
    given = given_options(options)
    if given and "openvino" not in given and not isinstance(options, (list, tuple)):
        names = ", ".join(type(o).__name__ for o in given.values())
        return Choice("onnxruntime", "auto", reason=f"{kind} artifact, options= are {names}: {instead}",
                      certificate=certificate, auto=True)
    return Choice("openvino", "openvino", hint, auto=True, certificate=certificate,
                  reason=f"{kind} artifact certified on OpenVINO ({certificate.describe()}), this CPU has {described}")


def backend_options(choice: Choice, options: Options = None, threads: int | None = None) -> Any:
    """The options ``choice.backend`` opens with (:func:`options_for`), with what ``choice`` fixes:
    ``auto``'s certified OpenVINO hint, unless the user's own options name a precision."""
    built = options_for(choice.backend, options, threads)
    if choice.ov_precision is not None and built.precision is None:
        built = dataclasses.replace(built, precision=choice.ov_precision)
    return built


def open_session(directory: str | os.PathLike[str], provider: str = "auto", options: Options = None,
                 choice: Choice | None = None, manifest: Manifest | None = None, threads: int | None = None) -> Session:
    """The graph of the artifact (or engine directory) ``directory`` opened where ``choice``
    (default: :func:`choose_backend` for ``provider`` and ``options``) runs it, with
    :func:`backend_options` of ``options`` and ``threads``: the graph file the manifest names
    for that backend (:meth:`~kvembed.artifact.Manifest.graph_file`), or the directory itself for a
    backend that claims it. ``manifest``: the artifact's, as the caller loaded it (read here only
    when not given)."""
    path = Path(directory)
    choice = choice or choose_backend(path, provider, manifest, options=options)
    entry = BACKENDS[choice.backend]
    built = backend_options(choice, options, threads)
    if entry.opens_directories:
        target = path
    else:
        target = path / (manifest if manifest is not None else load_manifest(path)).graph_file(choice.backend)
    return entry.load().open_graph(target, choice.provider, built)


def open_artifact(manifest: Manifest, provider: str = "auto", options: Options = None, *, verify: bool = True,
                  threads: int | None = None) -> tuple[Session, Choice]:
    """The one way an artifact (or engine directory) is opened: the session of ``manifest``'s
    artifact where :func:`choose_backend` runs it for ``provider``, with the backend's ``options``
    and ``threads``), after :func:`verify_files` of what that backend reads (``verify``), with
    the backend's caveat as a warning; and the choice, which says why."""
    path = manifest.artifact_directory()
    choice = choose_backend(path, provider, manifest, options)
    built = backend_options(choice, options, threads)
    if choice.backend == "openvino" and built.precision != choice.ov_precision:  # the hint asked for: the choice's target
        choice = dataclasses.replace(choice, ov_precision=built.precision)
    if verify:
        verify_files(manifest, choice.backend)
    with waiting(f"opening the graph of {path} on {choice.target}"):
        session = open_session(path, provider, built, choice, manifest)
    caveat = load_warning(path, session, manifest.precision)
    if caveat is not None:
        warnings.warn(caveat, stacklevel=3)
    return session, choice


def session_backend(session: Session) -> str:
    """The catalogue backend of ``session``: its target's (a session is named by the target it runs)."""
    return TARGETS[session.name].backend


def verify_files(manifest: Manifest, backend: str) -> None:
    """Check the files ``backend`` will read in the artifact of ``manifest`` (as
    :func:`~kvembed.artifact.load_manifest` read it) against their records: the backend's own
    ``verify_files`` where it has one (an engine directory's plan), else
    :func:`~kvembed.artifact.check_intact`; an error naming every damaged file and what to do."""
    path = manifest.artifact_directory()
    own = getattr(BACKENDS[backend].load(), "verify_files", None)
    if own is not None:
        own(path, manifest)
        return
    with waiting(f"checking the sha256 of the files of {path}"):
        check_intact(manifest)


def load_warning(directory: str | os.PathLike[str], session: Session, precision: str) -> str | None:
    """A caveat of running the ``precision`` artifact ``directory`` on ``session``'s backend as it
    runs there (onnxruntime's CPU provider with fp16 weights), or None."""
    warn = getattr(BACKENDS[session_backend(session)].load(), "load_warning", None)
    return None if warn is None else warn(Path(directory), session, precision)


def provider_problem(provider: str) -> str | None:
    """Why the runtime provider ``provider`` cannot run here, or None (``auto`` always can: it falls
    back to the CPU): the problem of the first target it is an alias of (``tensorrt``: onnxruntime's
    TensorRT execution provider; ``openvino``: OpenVINO itself)."""
    names = PROVIDER_TARGETS[check_provider(provider)]
    return target_problem(names[0]) if names else None


def target_problem(target: str) -> str | None:
    """Why ``target`` (:data:`~.targets.TARGETS`) cannot run here (and what to install), or None."""
    spec = TARGETS[target]
    if spec.backend == REFERENCE_BACKEND:
        return reference_problem()
    return BACKENDS[spec.backend].probe(spec.setting or None)


def session_memory(artifact: Manifest | str | os.PathLike[str], provider: str = "cpu") -> int:
    """Bytes of memory one loaded session of ``artifact`` (its manifest or directory) holds at its peak, for
    schedulers that must not put more sessions on a machine than fit (Ray's ``memory``): its graph
    files' bytes times what the backend makes of them (its ``weight_factor`` under the options the
    choice opens it with), plus :data:`SESSION_OVERHEAD`. GPU providers are counted as the CPU
    (what the host holds while the weights are loaded)."""
    manifest = manifest_of(artifact)
    path, precision = manifest.artifact_directory(), manifest.precision
    graph = sum(p.stat().st_size for p in path.iterdir() if p.is_file() and p.name.startswith(MODEL))
    choice = choose_backend(path, provider, manifest)
    factor = BACKENDS[choice.backend].load().weight_factor(precision, backend_options(choice))
    return int(graph * factor + SESSION_OVERHEAD)
