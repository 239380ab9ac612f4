"""Realises method specs on Hugging Face models (torch): attention function, hooks, early exit."""

from .architectures import SUPPORTED, architecture_of, base_model
from .model import EmbeddingModel

__all__ = ["SUPPORTED", "EmbeddingModel", "architecture_of", "base_model"]
