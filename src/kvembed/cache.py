"""Where kvembed keeps what it can rebuild (dequantized GGUF models, compiled OpenVINO blobs).

Torch-free and dependency-free, so the runtime and the exporter can both use it.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``KVEMBED_CACHE_DIR`` or ``~/.cache/kvembed``."""
    return Path(os.environ.get("KVEMBED_CACHE_DIR") or Path.home() / ".cache" / "kvembed").expanduser()
