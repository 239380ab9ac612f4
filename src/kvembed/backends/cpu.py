"""What this CPU can compute fast: the one capability probe behind bf16 and fp16 (the export's
refusal, OpenVINO's precision hint, what ``provider="auto"`` picks, the flags a certificate records).

The probe reads Linux's ``/proc/cpuinfo`` flags; BF16 means AVX-512 BF16 or AMX-BF16, FP16 means
AVX-512 FP16 or AMX-FP16 (the instructions OpenVINO's CPU plugin runs bf16 / f16 matmuls with;
elsewhere its bf16 or f16 hint runs f32). Where ``openvino`` is installed, its CPU plugin's
``OPTIMIZATION_CAPABILITIES`` has the last word.

``KVEMBED_CPU_FEATURES`` replaces the probe: a comma list of cpuinfo flag names (``avx2,avx512f``;
``none`` for none). It states what a CPU has, for machines whose probe is wrong and for checking
on one CPU what kvembed does on another (a CPU without BF16 is exactly a list without
``avx512_bf16`` and ``amx_bf16``): the export refuses bf16, ``auto`` falls back, and an
OpenVINO session under the bf16 hint runs f32, as OpenVINO does on such a CPU.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

ENV = "KVEMBED_CPU_FEATURES"
#: the flags that give bf16 matmuls
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
#: the flags that give fp16 arithmetic on x86 (OpenVINO's f16 hint runs f32 without them)
FP16_FLAGS = ("avx512_fp16", "amx_fp16")
#: OpenVINO's reduced-precision hints -> the capability (a :class:`CpuFeatures` field) that runs
#: them as asked; any other hint (f32) runs everywhere
HINT_NEEDS = {"bf16": "bf16", "f16": "fp16"}
#: OpenVINO's reduced-precision hints -> the AMX flag whose tiles run their matmuls (several times
#: the AVX-512 units' rate: a CPU with AMX-BF16 but not AMX-FP16 runs bf16 on tiles, f16 on vectors)
HINT_TILES = {"bf16": "amx_bf16", "f16": "amx_fp16"}
#: the flags a certificate records: what decides which kernels a backend runs
RELEVANT_FLAGS = (
    "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "asimd", "bf16", "i8mm", "sve",
)


@dataclass(frozen=True)
class CpuFeatures:
    """The relevant flags of this CPU (or of the one ``KVEMBED_CPU_FEATURES`` describes)."""

    flags: tuple[str, ...]
    #: ``"probe"`` (cpuinfo, and OpenVINO's plugin where installed) or ``"KVEMBED_CPU_FEATURES"``
    source: str
    bf16: bool
    fp16: bool = False

    def describe(self, kind: str = "bf16") -> str:
        """One phrase for messages: which ``kind`` (``bf16``, ``fp16``) instructions, and where the facts came from."""
        flags = {"bf16": BF16_FLAGS, "fp16": FP16_FLAGS}[kind]
        name = kind.upper()
        have = [flag for flag in flags if flag in self.flags]
        what = (f"{name} ({', '.join(have) or f'OpenVINO lists {name}'})" if getattr(self, kind)
                else f"no {name} (no {' / '.join(flags)})")
        return what + (f", as {ENV} says" if self.source == ENV else "")

    def runs(self, hint: str) -> bool:
        """Whether OpenVINO's precision ``hint`` runs as asked here (a reduced one needs its
        instructions; without them OpenVINO runs f32)."""
        return hint not in HINT_NEEDS or bool(getattr(self, HINT_NEEDS[hint]))

    def speed_rank(self, hint: str) -> tuple[bool, bool]:
        """A sort key: how fast this CPU runs OpenVINO's precision ``hint``, fastest lowest: on AMX
        tiles, then as asked on vector units, then in f32 (a reduced hint without its instructions)."""
        return (not self.runs(hint), HINT_TILES.get(hint) not in self.flags)

    def fastest_first(self, hints: Sequence[str]) -> tuple[str, ...]:
        """``hints`` by :meth:`speed_rank`; ties keep the given order (callers list the more precise first)."""
        return tuple(sorted(hints, key=self.speed_rank))

    def describe_hint(self, hint: str) -> str:
        """:meth:`describe` of the capability ``hint`` needs (BF16 for bf16, FP16 for f16)."""
        return self.describe(HINT_NEEDS.get(hint, "bf16"))

    def to_dict(self) -> dict[str, object]:
        return {"flags": list(self.flags), "bf16": self.bf16, "fp16": self.fp16, "source": self.source}


def parse_features(text: str) -> tuple[str, ...]:
    """``KVEMBED_CPU_FEATURES``'s value as flag names (lower case, sorted; ``none``: no flags)."""
    names = {name.strip().lower() for name in text.replace(" ", ",").split(",") if name.strip()}
    return tuple(sorted(names - {"none"}))


def cpu_features() -> CpuFeatures:
    """This CPU's capabilities, or those ``KVEMBED_CPU_FEATURES`` states (read on every call: it is
    an override a process may set before loading)."""
    given = os.environ.get(ENV)
    if given is not None and given.strip():
        flags = parse_features(given)
        return CpuFeatures(flags, ENV, any(flag in flags for flag in BF16_FLAGS), any(flag in flags for flag in FP16_FLAGS))
    return _probed()


@functools.lru_cache(maxsize=1)
def _probed() -> CpuFeatures:
    flags = tuple(sorted(set(_cpuinfo_flags()) & set(RELEVANT_FLAGS)))
    listed = _openvino_capabilities()
    bf16 = any(flag in flags for flag in BF16_FLAGS) if listed is None else "BF16" in listed
    fp16 = any(flag in flags for flag in FP16_FLAGS) and (listed is None or "FP16" in listed)
    return CpuFeatures(flags, "probe", bf16, fp16)


def _cpuinfo_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:  # not Linux: only OpenVINO's plugin can tell
        return []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return value.split()
    return []


def _openvino_capabilities() -> set[str] | None:
    """OpenVINO's CPU plugin's ``OPTIMIZATION_CAPABILITIES`` (BF16, FP16, ...); None without openvino."""
    try:
        import openvino
    except Exception:
        return None
    try:
        capabilities = openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    except Exception:  # an old or unusual plugin: the flags decide
        return None
    return {str(c).upper() for c in capabilities}
