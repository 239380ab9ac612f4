"""kvembed's version: one place, read by the package, its manifests and pyproject.toml."""

__version__ = "0.1.0"
