"""The corpus progress bar (rows, tokens/s, ETA) with rich; both runners feed it ``(rows, tokens)``."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any


class CorpusProgress:
    """Counts rows and tokens (thread-safe) and, when shown, draws them as a rich progress bar."""

    def __init__(self, total_rows: int, done_rows: int = 0, show: bool | None = None) -> None:
        """``done_rows``: rows embedded by an earlier run (a resume), counted but not timed."""
        self.total = total_rows
        self.rows, self.tokens = done_rows, 0
        self.show = sys.stderr.isatty() if show is None else show
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> "CorpusProgress":
        if self.show:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._bar = Progress(
                TextColumn("embedding"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"),
                TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                console=Console(stderr=True),
            )
            self._bar.start()
            self._task = self._bar.add_task("embedding", total=self.total, completed=self.rows, rate="- tokens/s")
        return self

    def advance(self, rows: int, tokens: int) -> None:
        with self._lock:
            self.rows += rows
            self.tokens += tokens
            if self._bar is not None:
                rate = self.tokens / max(time.monotonic() - self.started, 1e-9)
                self._bar.update(self._task, completed=self.rows, rate=f"{rate:,.0f} tokens/s")

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.stop()
