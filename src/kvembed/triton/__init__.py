"""Triton Inference Server model repositories for kvembed artifacts (``kvembed triton``).

``write_repository(artifacts, out, ...)`` writes, per artifact, a python-backend tokenizer,
the graph on the chosen backend and an ensemble tying them together (see
:mod:`kvembed.triton.repository`); :mod:`kvembed.triton.server` starts a local ``tritonserver``
on such a repository. This package is copied (``rows.py`` and this file) into generated
repositories, so it imports nothing at import time.
"""


def __getattr__(name: str):
    if name == "write_repository":
        from .repository import write_repository

        return write_repository
    if name == "ServingOptions":
        from .options import ServingOptions

        return ServingOptions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ServingOptions", "write_repository"]
