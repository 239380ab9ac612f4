"""How the export tells its caller where it is: ``progress(stage, detail)`` calls in the order
of :data:`STAGES`, plus ``progress.advance(done, total)`` inside a long stage where the caller's
display has it (the CLI shows the time left from it).
"""

from __future__ import annotations

import time
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


class StageClock:
    """A progress that times the stages it passes on to ``progress``: each stage's seconds run from
    its first report to the next stage's (a stage reported again later adds to its own), so the
    export's report says where its time went (:attr:`~kvembed.artifact.report.ExportReport.timings`)."""

    def __init__(self, progress: Progress, clock: Callable[[], float] | None = None) -> None:
        self._progress = progress
        self._clock = clock or time.monotonic
        self._stage: str | None = None
        self._since = 0.0
        self._seconds: dict[str, float] = {}
        advance = advance_of(progress)
        if advance is not None:
            self.advance = advance

    def __call__(self, stage: str, detail: str) -> None:
        if stage != self._stage:
            self._close()
            self._stage, self._since = stage, self._clock()
        self._progress(stage, detail)

    def _close(self) -> None:
        if self._stage is not None:
            now = self._clock()
            self._seconds[self._stage] = self._seconds.get(self._stage, 0.0) + now - self._since
            self._since = now

    def seconds(self) -> dict[str, float]:
        """Seconds per stage so far, the current stage's up to now, in the order they first ran."""
        self._close()
        return dict(self._seconds)
