"""OpenVINO backend: runs an artifact's ``model.onnx`` with OpenVINO's CPU plugin instead of onnxruntime.

``openvino`` is optional (``pip install 'kvembed[openvino]'``) and imported only when a session is
made, so the runtime imports without it. :class:`OpenVINOSession` offers exactly what
:class:`~kvembed.runtime.embedder.Embedder` uses of an onnxruntime session: ``get_inputs()``,
``get_providers()`` and ``run(output_names, feeds)``. Dynamic batch and sequence dimensions stay
dynamic (the model is compiled as exported, never reshaped).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from ..errors import MissingDependency

OPENVINO = "OpenVINO"
PRECISIONS = ("f32", "bf16")
INSTALL = "pip install 'kvembed[openvino]'"


class _Input(NamedTuple):
    name: str


def import_openvino() -> Any:
    try:
        import openvino
    except ImportError as err:
        raise MissingDependency(f"provider 'openvino' needs the openvino package: {INSTALL} ({err})") from None
    return openvino


def default_precision(core: Any) -> str:
    """``"bf16"`` when the CPU plugin lists BF16 among its optimisation capabilities, else ``"f32"``."""
    try:
        capabilities = core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    except Exception:  # an old or unusual plugin: the safe choice
        return "f32"
    return "bf16" if "BF16" in [str(c).upper() for c in capabilities] else "f32"


class OpenVINOSession:
    """A model compiled for OpenVINO's CPU device, used like an onnxruntime session.

    ``precision``: ``INFERENCE_PRECISION_HINT`` (``"f32"`` or ``"bf16"``; None = bf16 only where
    the CPU has it). ``threads``: ``INFERENCE_NUM_THREADS`` (None = OpenVINO's choice).
    ``cache_dir``: OpenVINO's ``CACHE_DIR`` for compiled blobs (None = no cache). Each :meth:`run`
    makes its own infer request, so concurrent calls from several threads are safe.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        threads: int | None = None,
        precision: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if precision is not None and precision not in PRECISIONS:
            raise ValueError(f"ov_precision must be one of {', '.join(PRECISIONS)} (or None for automatic), got {precision!r}")
        if threads is not None and int(threads) < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        ov = import_openvino()
        core = ov.Core()
        self.precision = precision or default_precision(core)
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": self.precision}
        if threads is not None:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        if cache_dir is not None:
            Path(cache_dir).mkdir(parents=True, exist_ok=True)
            config["CACHE_DIR"] = str(cache_dir)
        self.model_path = Path(model_path)
        try:
            self.compiled = core.compile_model(str(self.model_path), "CPU", config)
        except RuntimeError as err:
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            detail = (lines[-1] if lines else type(err).__name__)[:300]  # OpenVINO puts the cause last
            raise ValueError(
                f"OpenVINO cannot compile {self.model_path} ({detail}); a fused-attention artifact (opset-23 "
                "Attention op with grouped-query heads) needs re-exporting with --attention decomposed for "
                "OpenVINO, else the file is damaged: use provider='cpu'"
            ) from err
        self._inputs = [_Input(port.get_any_name()) for port in self.compiled.inputs]

    def get_inputs(self) -> list[_Input]:
        return list(self._inputs)

    def get_providers(self) -> list[str]:
        return [OPENVINO, self.precision]

    def run(self, output_names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        request = self.compiled.create_infer_request()  # one per call: concurrent runs share nothing
        request.infer({name: np.ascontiguousarray(array) for name, array in feeds.items()})
        return [np.array(request.get_tensor(name).data, copy=True) for name in output_names]


def create_session(
    model_path: str | os.PathLike[str],
    threads: int | None = None,
    precision: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> OpenVINOSession:
    return OpenVINOSession(model_path, threads, precision, cache_dir)
