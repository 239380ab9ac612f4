"""SIGTERM handled like Ctrl-C, so a scheduler stopping a run gets the same cleanup and message.

Slurm, Kubernetes, systemd and ``timeout`` stop jobs with SIGTERM, whose default action kills
Python with no cleanup (half-written ``.partial-*`` shards, an export's staging directory and its
traced fp32 graph: several times the model's size on disk, no message). Inside
:func:`sigterm_as_interrupt` SIGTERM raises :class:`Terminated`, a ``KeyboardInterrupt``, so it
takes the very path Ctrl-C takes (staging directories and work files removed, shard writers
abort, Ray shuts down, the CLI says what stopped). Afterwards
:func:`die_by_signal` ends the process by the signal itself, as GNU make and coreutils ``sort`` do
after cleaning up: the parent then sees "killed by SIGTERM" (shell status 143, Kubernetes exit
code 143, and systemd counts it as a clean stop rather than a failed exit status).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator, NoReturn


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived; raised like Ctrl-C's ``KeyboardInterrupt`` so the same cleanup runs."""

    signum = signal.SIGTERM


def _raise_terminated(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
    raise Terminated()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (elsewhere: no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def die_by_signal(signum: int) -> NoReturn:
    """End this process by ``signum`` at its default action (after the caller cleaned up)."""
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    raise SystemExit(128 + signum)  # only if the signal is blocked: the same status a shell shows
