"""The torch-free runtime: load an exported artifact and embed text with onnxruntime.

Importing this package never imports torch or transformers (a test proves it); kvembed
installed without extras brings only numpy, onnxruntime and tokenizers. The embedder and the
encoder load on first use of their names, so a command line reading the batching defaults
(``kvembed.runtime.batching``) does not import onnxruntime.
"""

from ..artifact import SCHEMA_VERSION, read_manifest
from ..lazy import lazy_exports

_EXPORTS = {"Embedder": "embedder", "TextEncoder": "encoding", "check_texts": "encoding", "format_prompt": "encoding",
            "preprocess_text": "encoding"}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(["SCHEMA_VERSION", "read_manifest", *_EXPORTS])
