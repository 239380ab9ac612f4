"""Targets: the one runtime unit. A *target* is a backend of the catalogue with one setting
(onnxruntime's execution provider, OpenVINO's precision hint), e.g. ``openvino-bf16``, or ONNX's
reference evaluator; what ``Embedder.target`` says ran, what a certificate names, what
``kvembed verify --backends`` and the parity gate run a graph on.

The runtime's *provider* names (``Embedder.load(provider=...)``, every ``--provider``) are aliases
of targets (:data:`PROVIDER_TARGETS`): ``cpu`` is ``onnxruntime-cpu``; ``openvino`` is whichever
OpenVINO target its precision hint makes. :func:`check_provider` is the one check of such a name.
Light: data only, no backend module (the catalogue's ``target_problem`` and ``open_target`` load one).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..errors import InvalidInput, shown, with_hint
from ..extras import install_hint

__all__ = [
    "CPU", "CUDA", "OPENVINO_HINTS", "ORT_TENSORRT", "OV_BF16", "OV_F16", "OV_F32", "PROVIDERS", "PROVIDER_HELP", "PROVIDER_TARGETS",
    "REFERENCE", "TARGETS", "TARGET_NAMES", "TENSORRT", "Target", "check_provider", "openvino_target", "providers",
    "reference_problem",
]

#: the backend name of ONNX's reference evaluator (a target, not a catalogue backend: verify only)
REFERENCE_BACKEND = "onnx-reference"


@dataclass(frozen=True)
class Target:
    """A backend with one setting: its name, the catalogue backend (or ONNX's reference evaluator),
    the setting (onnxruntime's provider name, OpenVINO's precision hint; empty where the backend
    has none), and the batching policy's defaults for it, which the runtime reads
    (:class:`~kvembed.runtime.batching.BatchPolicy`): whether it computes on the host's CPU (the
    runtime then cuts calls to its CPU token budget; on a GPU one call per batch is fastest) and
    its call cost, the padded tokens one more graph call is worth (None: cut batches greedily)."""

    name: str
    backend: str
    setting: str = ""
    on_cpu: bool = True
    call_cost: int | None = None


#: padded tokens one more graph call is worth on onnxruntime's CPU provider: a call's fixed cost is
#: small there, so splitting a batch pays off once it saves a few rows of padding; GPU targets, where
#: launches cost more, cut greedily instead (benchmarks/log/serve.md)
ORT_CPU_CALL_COST = 32
#: on OpenVINO each call streams every weight, so a split must save more padding than on onnxruntime
#: (benchmarks/log/openvino.md, "Short inputs")
OPENVINO_CALL_COST = 128


CPU, CUDA, ORT_TENSORRT, TENSORRT, OV_F32, OV_BF16, OV_F16, REFERENCE = (
    "onnxruntime-cpu", "onnxruntime-cuda", "onnxruntime-tensorrt", "tensorrt", "openvino-f32", "openvino-bf16",
    "openvino-f16", "onnx-reference",
)
#: every target, in the order verify runs and reports them (the first is every comparison's baseline)
TARGETS: dict[str, Target] = {t.name: t for t in (
    Target(CPU, "onnxruntime", "cpu", call_cost=ORT_CPU_CALL_COST),
    Target(CUDA, "onnxruntime", "cuda", on_cpu=False),
    Target(ORT_TENSORRT, "onnxruntime", "tensorrt", on_cpu=False),
    Target(TENSORRT, "tensorrt", on_cpu=False),
    Target(OV_F32, "openvino", "f32", call_cost=OPENVINO_CALL_COST),
    Target(OV_BF16, "openvino", "bf16", call_cost=OPENVINO_CALL_COST),
    Target(OV_F16, "openvino", "f16", call_cost=OPENVINO_CALL_COST),
    Target(REFERENCE, REFERENCE_BACKEND),
)}
TARGET_NAMES: tuple[str, ...] = tuple(TARGETS)
#: OpenVINO's precision hints, one target each
OPENVINO_HINTS: tuple[str, ...] = tuple(t.setting for t in TARGETS.values() if t.backend == "openvino")

#: the runtime's provider names, each an alias of the targets it may run on (``auto``: the choice
#: of :func:`~kvembed.backends.catalogue.choose_backend`; ``tensorrt``: onnxruntime's TensorRT
#: execution provider for an artifact, the TensorRT backend for an engine directory; ``openvino``:
#: the target of its precision hint)
PROVIDER_TARGETS: dict[str, tuple[str, ...]] = {
    "auto": (),
    "cpu": (CPU,),
    "cuda": (CUDA,),
    "tensorrt": (ORT_TENSORRT, TENSORRT),
    "openvino": (OV_F32, OV_BF16, OV_F16),
}
#: the runtime's provider names (``Embedder.load(provider=...)``, every CLI's ``--provider``)
PROVIDERS: tuple[str, ...] = tuple(PROVIDER_TARGETS)
#: the provider names as the CLIs' ``--provider`` help lists them
PROVIDER_HELP = ", ".join(PROVIDERS)


def check_provider(provider: object, flag: str = "provider") -> str:
    """``provider`` when it is one of :data:`PROVIDERS`; else one line naming the valid ones (and the
    closest), as ``flag`` (``--provider`` in a CLI) is called where it was given."""
    if not isinstance(provider, str) or provider not in PROVIDER_TARGETS:
        raise InvalidInput(with_hint(f"{flag} must be one of {', '.join(providers())}, got {shown(provider)}", provider, providers()))
    return provider


def providers() -> tuple[str, ...]:
    """The provider names as the registry holds them now (a backend registered after import included)."""
    return tuple(PROVIDER_TARGETS)


def openvino_target(precision: str) -> str:
    """The OpenVINO target of precision hint ``precision`` (``f32``, ``bf16``, ``f16``; a report's
    ``FP32``/``BF16`` as OpenVINO spells it)."""
    name = f"openvino-{precision.lower().replace('fp', 'f')}"
    if name not in TARGETS:
        raise InvalidInput(f"OpenVINO has no target for precision {precision!r}; one of f32, bf16, f16")
    return name


def reference_problem() -> str | None:
    """Why ONNX's reference evaluator cannot run here, or None."""
    try:
        importlib.import_module("onnx.reference")
    except ImportError:
        return f"onnx is not installed ({install_hint('export')})"
    return None
