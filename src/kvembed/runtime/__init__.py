"""The torch-free runtime: load an exported artifact and embed text with onnxruntime.

Importing this package never imports torch or transformers (a test proves it); a plain
``pip install kvembed`` brings only numpy, onnxruntime and tokenizers.
"""

from ..artifact import SCHEMA_VERSION, read_manifest
from .embedder import Embedder
from .encoding import TextEncoder, check_texts, format_prompt, preprocess_text

__all__ = ["SCHEMA_VERSION", "Embedder", "TextEncoder", "check_texts", "format_prompt", "preprocess_text", "read_manifest"]
