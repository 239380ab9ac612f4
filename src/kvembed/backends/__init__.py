"""Backends: one file per engine that runs an artifact's graph (onnxruntime, OpenVINO, TensorRT),
all behind the session protocol of :mod:`~kvembed.backends.protocol`, listed in
:mod:`~kvembed.backends.catalogue` (names, probes, options, what ``"auto"`` picks). Torch-free.
"""

from typing import Any

#: each backend's options dataclass (``Embedder.load(options=...)``), by its class name: read from
#: the catalogue's entries, so ``from kvembed import OpenVINOOptions`` imports the backend's file but
#: not its library
OPTION_TYPES = {"OnnxRuntimeOptions": "onnxruntime", "OpenVINOOptions": "openvino", "TensorRTOptions": "tensorrt"}


def __getattr__(name: str) -> Any:
    if name in OPTION_TYPES:
        from .catalogue import BACKENDS

        return BACKENDS[OPTION_TYPES[name]].options_type()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
