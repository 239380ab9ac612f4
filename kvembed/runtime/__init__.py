"""The torch-free runtime: tokenisation and batching shared with the reference, ONNX execution.

Importing this package must never import torch or transformers.
"""

from .encoding import TextEncoder, check_texts, format_prompt, preprocess_text

__all__ = ["TextEncoder", "check_texts", "format_prompt", "preprocess_text"]
