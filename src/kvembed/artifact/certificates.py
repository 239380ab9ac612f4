"""Certificates: which backend ran an artifact's graph, at which precision, on which CPU, and how
close it came, recorded in the manifest (``certified``) so the record travels with the artifact.

The exporter's parity gate writes one per backend it gated on (``against: "pytorch"``);
``kvembed verify --record`` adds the ones its re-run gate and its backend comparison passed
(``against: "onnxruntime-cpu"`` for a pair). Only passes are recorded. ``provider="auto"`` reads
them (:func:`kvembed.backends.catalogue.choose_backend`): it runs an artifact on a faster backend
only where a certificate against PyTorch says that backend, at that precision, met the
precision's bar. The manifest is not among the hashed files, so recording one invalidates nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ..errors import InvalidInput
from .jsonform import field_keys, over_raw

#: docs/methods.md ("What the same means"): worst row cosine and, for fp32, max abs difference on
#: normalised vectors, against the fp32 PyTorch reference
TOLERANCES: dict[str, dict[str, float]] = {
    "fp32": {"min_cosine": 0.99999, "max_abs": 1e-4},
    "fp16": {"min_cosine": 0.999},
    "bf16": {"min_cosine": 0.999},
    "int8": {"min_cosine": 0.99},
}
#: ``against`` of the parity gate's certificates
PYTORCH = "pytorch"
#: OpenVINO's precision names -> kvembed's
_PRECISION_NAMES = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "i8": "int8"}


def precision_name(name: str) -> str:
    """kvembed's name (fp32, bf16, ...) for a backend's precision name (OpenVINO's f32, bf16)."""
    return _PRECISION_NAMES.get(str(name).lower(), str(name).lower())


@dataclass(frozen=True)
class Certificate:
    """One passed check of the graph on one backend (see the module docstring)."""

    #: the verify target that ran (``openvino-bf16``, ``onnxruntime-cpu``, ...)
    target: str
    #: its backend (``openvino``, ``onnxruntime``, ``tensorrt``, ``onnx-reference``)
    backend: str
    #: the precision that ran, as the backend reported it (kvembed's names: fp32, bf16, fp16, int8)
    precision: str
    #: ``"pytorch"`` (the parity gate) or the baseline target a backend comparison used
    against: str
    worst_cosine: float
    min_cosine: float
    max_abs_diff: float | None = None
    #: the precision asked for where the backend may run another (OpenVINO's hint)
    hint: str | None = None
    #: the CPU's relevant flags, whether it has BF16, and where that came from (its probe or
    #: ``KVEMBED_CPU_FEATURES``)
    cpu: Mapping[str, Any] = field(default_factory=dict)
    kvembed_version: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: Any, where: str = "a certificate") -> "Certificate":
        if not isinstance(data, Mapping):
            raise InvalidInput(f"{where} must be an object, got {data!r}")
        try:
            return cls(
                str(data["target"]), str(data["backend"]), precision_name(data["precision"]), str(data["against"]),
                float(data["worst_cosine"]), float(data["min_cosine"]),
                None if data.get("max_abs_diff") is None else float(data["max_abs_diff"]),
                data.get("hint"), dict(data.get("cpu") or {}), str(data.get("kvembed_version", "")), dict(data),
            )
        except KeyError as err:
            raise InvalidInput(f"{where} lacks {err.args[0]}") from None
        except (TypeError, ValueError) as err:
            raise InvalidInput(f"{where} is malformed: {err}") from None

    def to_dict(self) -> dict[str, Any]:
        """The ``certified`` entry's JSON (as read, with the fields changed since)."""
        return over_raw(self, field_keys(Certificate), Certificate.from_dict, skip_none=("max_abs_diff", "hint"))

    @property
    def emulated(self) -> bool:
        """Asked for a lower precision than ran (bf16 hint on a CPU without BF16: f32 ran)."""
        return self.hint is not None and precision_name(self.hint) != self.precision

    def certifies(self, backend: str, precision: str, bar_of: str | None = None) -> bool:
        """Whether this says ``backend`` computing at ``precision`` met the bar of ``bar_of`` (default
        ``precision``) against PyTorch."""
        bar = TOLERANCES.get(bar_of or precision, {}).get("min_cosine")
        return (self.backend == backend and self.precision == precision and self.against == PYTORCH
                and bar is not None and self.worst_cosine >= bar)

    @property
    def decided_by(self) -> dict[str, dict[str, Any]]:
        """Which text sets decided this pass (``gate``, and ``held_out`` where they decide too), each
        with its ``texts``, ``rows`` and ``worst_cosine``; empty in certificates from before it was
        recorded and in backend comparisons."""
        sets = self.raw.get("decided_by")
        return {str(name): dict(item) for name, item in sets.items()} if isinstance(sets, Mapping) else {}

    def describe(self) -> str:
        """One phrase: ``openvino-bf16 ran bf16, worst cosine 0.99990 vs pytorch``, then the text
        sets that decided it: ``(decided by 60 gate texts 0.99990, 10 held-out texts 0.99950)``."""
        ran = f"ran {self.precision}" + (f" (hint {self.hint})" if self.emulated else "")
        text = f"{self.target} {ran}, worst cosine {self.worst_cosine:.5f} vs {self.against}"
        if self.decided_by:
            text += f" (decided by {decided_phrase(self.decided_by)})"
        return text


#: the text sets a parity check decides on, as sentences name them
TEXT_SETS = {"gate": "gate texts", "held_out": "held-out texts"}


def decided_phrase(sets: Mapping[str, Mapping[str, Any]]) -> str:
    """``60 gate texts 0.99990, 10 held-out texts 0.99950``: each text set that decided a check,
    with its worst cosine (a certificate's or a verify run's ``decided_by``)."""
    return ", ".join(f"{int(item.get('texts', 0))} {TEXT_SETS.get(name, name)} {float(item['worst_cosine']):.5f}"
                     for name, item in sets.items())


def certificates_of(data: Any, where: str = "certified") -> tuple[Certificate, ...]:
    """The manifest's ``certified`` list, typed (missing or null: none)."""
    if data is None:
        return ()
    if not isinstance(data, list):
        raise InvalidInput(f"{where} must be a list, got {data!r}")
    return tuple(Certificate.from_dict(item, f"{where}[{index}]") for index, item in enumerate(data))


def merged(existing: Iterable[Mapping[str, Any]], new: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``existing`` certificates with ``new`` ones added; a new one replaces an earlier one of the
    same target, against and CPU flags (the latest check of the same thing is the one kept)."""
    def key(item: Mapping[str, Any]) -> tuple:
        return item.get("target"), item.get("against"), tuple((item.get("cpu") or {}).get("flags", ()))

    fresh = [dict(item) for item in new]
    keys = {key(item) for item in fresh}
    return [dict(item) for item in existing if key(item) not in keys] + fresh
