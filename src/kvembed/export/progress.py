"""How the export tells its caller where it is: ``progress(stage, detail)`` calls in the order
of :data:`STAGES`, plus ``progress.advance(done, total)`` inside a long stage where the caller's
display has it (the CLI shows the time left from it).
"""

from __future__ import annotations

from typing import Callable

Progress = Callable[[str, str], None]

#: pipeline stages, in order, as reported to ``progress(stage, detail)`` ("reference" and "release"
#: only where the exporter frees the PyTorch weights after the trace:
#: :func:`~kvembed.export.core.export_result`)
STAGES = ("load", "reference", "trace", "release", "optimize", "convert", "check", "parity", "ranges", "write")


def silent(stage: str, detail: str) -> None:
    """The progress of a caller that wants none."""
    return None


def advance_of(progress: Progress) -> Callable[[int, int], None] | None:
    """``progress.advance(done, total)`` where the progress display has one (the CLI's shows the
    time left of a long stage), else None."""
    return getattr(progress, "advance", None)
