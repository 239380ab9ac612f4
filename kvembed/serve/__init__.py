"""``kvembed serve``: an OpenAI-compatible embeddings server on the torch-free runtime.

FastAPI + uvicorn (the ``serve`` extra). Importing this package never imports torch or
transformers (a test proves it): ``pip install 'kvembed[serve]'`` plus an artifact directory is a
whole deployment.
"""

from .app import create_app
from .config import ServeConfig, parse_artifact, parse_size

__all__ = ["ServeConfig", "create_app", "parse_artifact", "parse_size"]
