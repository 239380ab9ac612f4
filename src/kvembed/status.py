"""How a slow step says that it is starting, so that no wait of the command line is silent.

``with waiting("compiling model.onnx for OpenVINO"):`` logs one INFO record on the
``kvembed.status`` logger (:data:`STATUS_LOGGER`) as the step starts and one DEBUG record with
its duration as it ends. Library callers see them only if they configure logging; the command
line shows them as a spinner on a terminal and as whole lines on stderr when piped
(:mod:`kvembed.cli.status`). A leaf (the standard library only), so that every room (backends,
runtime, modeling, export, eval) can announce its waits without knowing who shows them.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Iterator

STATUS_LOGGER = "kvembed.status"
#: ``record.kvembed_phase`` of the two records of a step: its start and its end
START, END = "start", "end"
log = logging.getLogger(STATUS_LOGGER)


@contextmanager
def waiting(what: str) -> Iterator[None]:
    """Announce ``what`` (a short phrase: "loading the weights of smollm2-135m") before the step
    runs, and its end after it, even when it fails (``record.kvembed_seconds``, ``record.kvembed_ok``)."""
    log.info("%s", what, extra={"kvembed_phase": START, "kvembed_what": what})
    start, ok = time.monotonic(), False
    try:
        yield
        ok = True
    finally:
        seconds = time.monotonic() - start
        log.debug("%s: %.1fs", what, seconds,
                  extra={"kvembed_phase": END, "kvembed_what": what, "kvembed_seconds": seconds, "kvembed_ok": ok})


__all__ = ["END", "START", "STATUS_LOGGER", "waiting"]
