"""kvembed: training-free LLM text embeddings as production artifacts."""

__version__ = "0.1.0"
