"""Backends: one file per engine that runs an artifact's graph (onnxruntime, OpenVINO, TensorRT),
all behind the session protocol of :mod:`~kvembed.backends.protocol`, listed in
:mod:`~kvembed.backends.catalogue` (names, probes, options, what ``"auto"`` picks). Torch-free.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    """Each backend's options dataclass (``Embedder.load(options=...)``) by its class name, as the
    catalogue's entry names it: ``from kvembed import OpenVINOOptions`` imports the backend's file
    but not its library."""
    from .catalogue import BACKENDS

    entry = next((entry for entry in BACKENDS.values() if entry.options == name), None)
    if entry is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return entry.options_type()
