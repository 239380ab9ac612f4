"""``kvembed serve``: an OpenAI-compatible embeddings server on the torch-free runtime.

FastAPI + uvicorn (the ``serve`` extra). Importing this package never imports torch or
transformers (a test proves it), and FastAPI loads on first use of a name, so the command
line can read ``kvembed serve``'s options without the extra: ``pip install 'kvembed[serve]'`` plus an artifact directory is a
whole deployment.
"""

from ..lazy import lazy_exports

_EXPORTS = {"create_app": "app", "ServeConfig": "config", "parse_artifact": "config", "parse_size": "config"}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
