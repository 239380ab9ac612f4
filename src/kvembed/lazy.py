"""Names a package exports but loads on first use (PEP 562).

A command's package (``kvembed.serve``, ``kvembed.corpus``, ...) is imported whenever the
``kvembed`` command line starts, to read that command's options; its heavy dependencies (FastAPI,
pyarrow, ...) belong to an optional extra, so they must load only when the command runs.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that resolves ``exports[name]`` (a submodule of ``package``) on
    first access of ``name``."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(import_module(f".{exports[name]}", package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
