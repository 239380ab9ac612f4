"""TensorRT backend: engine directories (``kvembed build-engine``), running ``engine.plan``.

Here "engine" always means a TensorRT plan. The loader's half of the TensorRT path, torch-free
like the rest of the runtime: the record's checks (same TensorRT, same GPU, shapes inside a
profile; the record itself and the engine rule are :mod:`kvembed.artifact.engine`) and :class:`EngineSession`, which runs the plan with polygraphy's
``TrtRunner``. The builder's half is :mod:`kvembed.export.engine`. tensorrt and polygraphy are imported only when a plan first runs;
none of the GPU path has run on this project's CPU-only machines (README says so).
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import InvalidInput, MissingDependency
from ..artifact import Manifest, check_intact
from ..artifact.engine import PLAN, describe_profiles, engine_limits, is_engine_dir, read_engine_json

INSTALL_HINT = "pip install tensorrt polygraphy (TensorRT >= 10 with an NVIDIA GPU and driver)"
#: where TensorRT itself comes from (PyPI's tensorrt is a stub without it)
TENSORRT_HINT = "install TensorRT from NVIDIA, https://developer.nvidia.com/tensorrt"
NAME = "tensorrt"
TENSORRT = "TensorRT"


@dataclass(frozen=True)
class TensorRTOptions:
    """How a TensorRT plan is opened: nothing to choose (``kvembed build-engine`` fixes its precision
    and shapes)."""


def probe(provider: str | None = None) -> str | None:
    """Why TensorRT cannot be used here, or None when ``import tensorrt`` gives a real TensorRT."""
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return f"not installed (pip has only stubs; {TENSORRT_HINT})"
    except Exception as err:  # a broken install (missing libnvinfer, CUDA driver)
        return f"import tensorrt failed ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); {TENSORRT_HINT}"
    if not hasattr(tensorrt, "Builder"):
        return f"the installed tensorrt package is a stub without TensorRT; {TENSORRT_HINT}"
    return None


def weight_factor(precision: str, options: TensorRTOptions | None = None) -> float:
    """Host bytes per byte of plan: the plan is read once to deserialise it, and the weights then
    live on the GPU (an estimate: never measured, this project's machines have no GPU)."""
    return 1.0


#: an engine directory runs here and nowhere else (the catalogue asks before it picks a backend)
claims = is_engine_dir


def verify_files(directory: Path, manifest: Manifest) -> None:
    """The engine directory's files against its manifest and ``engine.json``
    (:func:`~kvembed.artifact.check_intact`: the plan checked instead of the graph it was built from)."""
    check_intact(manifest, engine=read_engine_json(directory))


def check_engine_matches(record: Mapping[str, Any], tensorrt_version: str, gpu_name: str, compute_capability: str) -> None:
    """Refuse a plan built by another TensorRT or for another GPU (plans are not portable)."""
    if str(record["tensorrt_version"]) != str(tensorrt_version):
        raise InvalidInput(f"engine built with TensorRT {record['tensorrt_version']}, this is TensorRT {tensorrt_version}: "
                         "rebuild it here with kvembed build-engine")
    built = record["gpu"]
    if str(built["compute_capability"]) != str(compute_capability) or built["name"] != gpu_name:
        raise InvalidInput(f"engine built for {built['name']} (compute capability {built['compute_capability']}), "
                         f"this GPU is {gpu_name} ({compute_capability}): rebuild it here with kvembed build-engine")


def check_feeds_fit(record: Mapping[str, Any], shape: tuple[int, int]) -> int:
    """The index of the first profile that takes a (batch, sequence) feed; a ValueError naming the
    limits and the fix when none does."""
    batch, sequence = shape
    for index, p in enumerate(record["profiles"]):
        if p["min"][0] <= batch <= p["max"][0] and p["min"][1] <= sequence <= p["max"][1]:
            return index
    raise InvalidInput(f"a batch of {batch} x {sequence} tokens is outside every profile of this engine ({describe_profiles(record)}): "
                     "pass a smaller batch_size / max_tokens, or rebuild with a wider --shapes")


def require_tensorrt(purpose: str = "building a TensorRT engine") -> tuple[Any, Any]:
    """``(tensorrt, polygraphy.backend.trt)``, or MissingDependency naming what to install."""
    try:
        import tensorrt as trt
    except ImportError as err:
        raise MissingDependency(f"{purpose} needs the tensorrt package ({err}): {INSTALL_HINT}") from err
    try:
        from polygraphy.backend import trt as poly_trt
    except ImportError as err:
        raise MissingDependency(f"{purpose} needs polygraphy ({err}): {INSTALL_HINT}") from err
    return trt, poly_trt


def gpu_identity() -> tuple[str, str]:
    """(name, compute capability "major.minor") of CUDA device 0, from nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise MissingDependency(f"no NVIDIA GPU visible (nvidia-smi: {err}); TensorRT engines need one") from err
    name, capability = (part.strip() for part in out.strip().splitlines()[0].rsplit(",", 1))
    return name, capability


class EngineSession:
    """Runs an engine directory's ``engine.plan`` with polygraphy's TrtRunner, behind the
    :class:`~kvembed.backends.protocol.Session` protocol.

    Construction reads only ``engine.json`` (no TensorRT needed); TensorRT, the GPU check (the
    plan's TensorRT version and GPU must be this machine's) and the runner are set up on the first
    :meth:`run`, so the runtime imports, and an engine directory can be opened and inspected,
    anywhere. Each feed runs under the first optimization profile that takes its shape.
    Never run here: this project's machines have no GPU.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.record = read_engine_json(self.directory)
        self.limits = engine_limits(self.record)
        self._runner: Any = None
        self._profile: int | None = None
        self._lock = threading.Lock()  # one execution context: calls (and profile switches) take turns

    @property
    def active(self) -> bool:
        return self._runner is not None

    name = NAME
    #: a plan's normalisation runs as built
    renormalise = False

    @property
    def input_names(self) -> list[str]:
        return list(self.record["inputs"])

    @property
    def providers(self) -> list[str]:
        return [TENSORRT, str(self.record["precision"])]

    def _activate(self) -> None:
        trt, poly = require_tensorrt("running a TensorRT engine")
        check_engine_matches(self.record, trt.__version__, *gpu_identity())
        from polygraphy.backend.common import BytesFromPath

        runner = poly.TrtRunner(poly.EngineFromBytes(BytesFromPath(str(self.directory / PLAN))))
        runner.activate()
        self._runner = runner

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str]) -> list[np.ndarray]:
        profile = check_feeds_fit(self.record, tuple(next(iter(feeds.values())).shape[:2]))
        with self._lock:
            if self._runner is None:
                self._activate()
            if profile != self._profile:
                self._runner.set_profile(profile)
                self._profile = profile
            result = self._runner.infer({name: np.ascontiguousarray(a) for name, a in feeds.items()})
            return [np.array(result[name], copy=True) for name in outputs]  # the runner reuses its buffers

    def close(self) -> None:
        with self._lock:
            if self._runner is not None:
                self._runner.deactivate()
                self._runner = None
                self._profile = None



def open_graph(directory: str | os.PathLike[str], provider: str = NAME, options: TensorRTOptions | None = None) -> EngineSession:
    """The plan of the engine directory ``directory`` (TensorRT itself is needed only when it first
    runs; ``provider`` is ``"auto"`` or ``"tensorrt"``)."""
    return EngineSession(directory)
