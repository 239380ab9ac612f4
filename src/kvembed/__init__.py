"""kvembed: training-free LLM text embeddings as production artifacts.

``from kvembed import Embedder`` is the torch-free runtime (an exported artifact -> vectors);
``from kvembed import TorchEmbedder`` is the PyTorch reference (a model -> vectors), which needs
the ``export`` extra. Both load on first use, so ``import kvembed`` stays light and torch-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_exports

from .version import __version__
__all__ = ["Embedder", "OnnxRuntimeOptions", "OpenVINOOptions", "TensorRTOptions", "TorchEmbedder", "__version__"]

if TYPE_CHECKING:
    from .backends import OnnxRuntimeOptions, OpenVINOOptions, TensorRTOptions
    from .modeling.reference import TorchEmbedder
    from .runtime.embedder import Embedder

# each backend's options (``Embedder.load(options=...)``) through the backends' registry
__getattr__ = lazy_exports(__name__, {
    "Embedder": "runtime.embedder", "TorchEmbedder": "modeling.reference", "OnnxRuntimeOptions": "backends",
    "OpenVINOOptions": "backends", "TensorRTOptions": "backends",
})
