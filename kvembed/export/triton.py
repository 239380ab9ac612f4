"""``kvembed.export.triton.write_repository``: Triton model repositories for exported artifacts.

The implementation lives in :mod:`kvembed.triton` (repository writer, configs, python-backend
models, local server helper); this module is its home next to the exporter.
"""

from ..triton.configs import ServingOptions, read_config
from ..triton.repository import write_repository

__all__ = ["ServingOptions", "read_config", "write_repository"]
