"""What a command shows while it waits: the steps announced on the ``kvembed.status`` logger
(:func:`kvembed.status.waiting`) and the command's own (:meth:`Waits.step`).

On a terminal the current step is a spinner on stderr, replaced as steps start and end. Piped,
a step that runs past :func:`announce_after` seconds (``KVEMBED_STATUS_AFTER``, default 1) gets
one whole line on stderr, never wrapped or cut, so no wait of more than a second or two is
silent, while a command that fails at once still prints its one error line alone. Either way a
step announced that way ends with a line of its time. stdout keeps only the command's data.

Imports only rich (and the standard library): every command loads it.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from rich.console import Console
from rich.markup import escape

from ..status import END, START, STATUS_LOGGER

#: the command line's stderr for errors and warnings (whatever ``sys.stderr`` is when one prints)
stderr_console = Console(stderr=True)

AFTER_ENV = "KVEMBED_STATUS_AFTER"
#: seconds a step runs, piped, before its line is printed (0: every step, as it starts)
DEFAULT_AFTER = 1.0
#: the help epilog of ``kvembed``: how to see every step
STATUS_HELP = (f"Waits show as a spinner on stderr, or piped as whole lines for steps that run past "
               f"{AFTER_ENV} seconds (default {DEFAULT_AFTER:g}; 0: every step as it starts; inf: none).")


def announce_after() -> float:
    """``KVEMBED_STATUS_AFTER`` as seconds (a bad value is the default)."""
    try:
        return max(0.0, float(os.environ.get(AFTER_ENV, DEFAULT_AFTER)))
    except ValueError:
        return DEFAULT_AFTER


@dataclass(eq=False)  # a step is itself: two of the same name are two steps
class _Step:
    what: str
    start: float = field(default_factory=time.monotonic)
    announced: bool = False
    timer: threading.Timer | None = None


class Waits(logging.Handler):
    """The status display of one command run (a context manager); see the module docstring.

    ``spinner``: a rich spinner on a terminal (None: when ``console`` is a terminal; False: lines
    only, e.g. beside uvicorn's log). ``show``: where lines go (default: ``console``, unwrapped).
    Displays nest: the innermost one entered shows the steps until it exits (:meth:`active`)."""

    def __init__(self, console: Console | None = None, spinner: bool | None = None,
                 show: Callable[[str], None] | None = None) -> None:
        super().__init__(level=logging.DEBUG)
        self.console = console
        self.spinner = spinner
        #: a step that runs this long is worth a line of its time (and, piped, a line as it runs)
        self.threshold = announce_after()
        self.after = self.threshold
        self._show = show
        self._steps: list[_Step] = []
        self._lock = threading.RLock()
        self._status: Any = None
        self._logger = logging.getLogger(STATUS_LOGGER)
        self._saved: tuple[int, bool, list[logging.Handler]] | None = None

    # -- lifetime ---------------------------------------------------------------------------------

    @classmethod
    def active(cls) -> "Waits | None":
        """The display that shows the steps now (the innermost entered), or None."""
        return next((h for h in logging.getLogger(STATUS_LOGGER).handlers if isinstance(h, cls)), None)

    def __enter__(self) -> "Waits":
        if self.console is None:  # the stderr of the command's start: a step's code may redirect sys.stderr
            self.console = Console(file=sys.stderr)
        if self.spinner is None:
            self.spinner = self.console.is_terminal
        self.after = 0.0 if self.spinner else self.threshold
        outer = [h for h in self._logger.handlers if isinstance(h, Waits)]
        self._saved = (self._logger.level, self._logger.propagate, outer)
        for handler in outer:
            self._logger.removeHandler(handler)
        self._logger.setLevel(logging.DEBUG)
        self._logger.propagate = False  # shown here, not twice through a root handler
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._logger.removeHandler(self)
        if self._saved is not None:
            level, propagate, outer = self._saved
            self._logger.setLevel(level)
            self._logger.propagate = propagate
            for handler in outer:
                self._logger.addHandler(handler)
        with self._lock:
            for step in self._steps:
                if step.timer is not None:
                    step.timer.cancel()
            self._steps.clear()
            self._refresh()

    # -- steps ------------------------------------------------------------------------------------

    def begin(self, what: str) -> None:
        """Step ``what`` starts."""
        step = _Step(what)
        with self._lock:
            self._steps.append(step)
            if self.spinner or self.after <= 0:
                self._announce(step)
            elif math.isfinite(self.after):  # inf: never announced (a Timer cannot wait forever)
                step.timer = threading.Timer(self.after, self._announce, args=(step,))
                step.timer.daemon = True
                step.timer.start()
            self._refresh()

    def end(self, what: str, ok: bool = True, quiet: bool = False) -> float:
        """End the latest step named ``what`` (``ok``: it did not fail; ``quiet``: its caller reports
        its time); returns its seconds (0 when there is none)."""
        with self._lock:
            found = next((s for s in reversed(self._steps) if s.what == what), None)
            if found is None:
                return 0.0
            self._steps.remove(found)
            if found.timer is not None:
                found.timer.cancel()
            seconds = time.monotonic() - found.start
            if not quiet and found.announced and seconds >= self.threshold:
                self.line(f"  {'done' if ok else 'stopped'} {what} ({seconds:.1f}s)")
            self._refresh()
            return seconds

    def update(self, what: str, detail: str) -> None:
        """Add ``detail`` (a share done, the time left) to the spinner of step ``what`` (terminal only)."""
        with self._lock:
            if self._status is not None and self._steps and self._steps[-1].what == what:
                self._status.update(f"{escape(what)} [dim]{escape(detail)}[/]")

    def line(self, text: str) -> None:
        """One whole line on stderr (above the spinner on a terminal), never wrapped."""
        with self._lock:
            if self._show is not None:
                self._show(text)
            else:
                self.console.print(escape(text), highlight=False, soft_wrap=True)

    # -- logging.Handler --------------------------------------------------------------------------

    def emit(self, record: logging.LogRecord) -> None:
        phase, what = getattr(record, "kvembed_phase", None), getattr(record, "kvembed_what", None)
        if what is None:
            return
        if phase == START:
            self.begin(what)
        elif phase == END:
            self.end(what, getattr(record, "kvembed_ok", True))

    # -- display ----------------------------------------------------------------------------------

    def _announce(self, step: _Step) -> None:
        with self._lock:
            if step not in self._steps or step.announced:
                return
            step.announced = True
            if not self.spinner:
                self.line(f"{step.what} ...")

    def _refresh(self) -> None:
        """The spinner shows the innermost running step; none runs: no spinner."""
        if not self.spinner:
            return
        if not self._steps:
            if self._status is not None:
                self._status.stop()
                self._status = None
            return
        text = escape(self._steps[-1].what)
        if self._status is None:
            self._status = self.console.status(text, spinner="dots")
            self._status.start()
        else:
            self._status.update(text)


def runtime_of(embedder: Any, subject: str = "model's PyTorch reference") -> str:
    """The ``runtime:`` line of a loaded embedder: an artifact's own
    (:meth:`kvembed.runtime.Embedder.runtime_line`), else PyTorch running ``subject``
    (``kvembed embed --model``, eval's model sources and trained baselines)."""
    own = getattr(embedder, "runtime_line", None)
    if callable(own):
        return str(own())
    from ..runtime.embedder import runtime_line

    return runtime_line("pytorch", "fp32", subject=subject)


def print_corpus_runtime(manifest: Any) -> None:
    """Print the ``runtime:`` line of an embed-corpus run from its manifest: the backends its
    workers (other processes, perhaps other machines) reported, and why its provider chose them."""
    from ..backends.catalogue import choose_backend
    from ..runtime.embedder import runtime_line

    artifact = manifest.get("artifact", {})
    choice = choose_backend(artifact["path"], manifest.get("options", {}).get("provider", "auto"))
    ran = ", ".join(artifact.get("backends") or []) or choice.backend
    stderr_console.print(escape(runtime_line(ran, str(artifact.get("precision")), choice)), highlight=False, soft_wrap=True)


__all__ = ["AFTER_ENV", "Waits", "announce_after", "print_corpus_runtime", "runtime_of", "stderr_console"]
