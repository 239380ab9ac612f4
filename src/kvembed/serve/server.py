"""Run the app under uvicorn with a graceful SIGTERM (stop accepting, drain, exit 0), and a
deadline for each request's headers, which uvicorn itself does not have."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from types import FrameType
from typing import Any, Callable, Iterator, NoReturn

import uvicorn


class DrainingServer(uvicorn.Server):
    """uvicorn's server, told about shutdown as soon as the signal arrives, and returning normally.

    On SIGTERM/SIGINT uvicorn closes the listening socket (new connections are refused), lets the
    requests in flight finish, then runs the app's shutdown. ``on_signal`` marks the app as draining
    so a request that still reaches it on a kept-alive connection gets 503. Stock uvicorn re-raises
    the signal after its graceful shutdown, which would make the exit status "killed by SIGTERM";
    a drained server has done its job, so this one returns and the process exits 0.
    """

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_signal = on_signal

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.on_signal()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        handled = (signal.SIGINT, signal.SIGTERM)
        original: dict[int, Any] = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def exit_without_joining(status: int = 0) -> NoReturn:
    """Exit at once, logs flushed, without joining threads: a graph call running in a worker thread
    cannot be interrupted, and Python's exit would wait for it past the graceful timeout. Nothing is
    lost: the server writes no files, and the requests those calls served have been answered."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def header_deadline(seconds: float, on_timeout: Callable[[], None]) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools where installed, else h11) with a deadline for headers:
    a connection that has not sent a whole request head within ``seconds`` of opening, or of the
    first byte of its next request, is closed (``on_timeout`` is told). Without it, a client that
    trickles its headers a byte at a time holds a socket for ever; an idle kept-alive connection
    is left to ``--keep-alive``. The body has its own deadline in the app (:mod:`.app`)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    base: Any = AutoHTTPProtocol

    class HeaderDeadline(base):  # type: ignore[misc, valid-type]
        _timer: asyncio.TimerHandle | None = None
        _seen: Any = None  # the request cycle whose headers were complete when last looked at

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm()  # the first bytes of the next request on a kept-alive connection
            super().data_received(data)
            if self.cycle is not None and self.cycle is not self._seen:  # a request's head is complete
                self._seen = self.cycle
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, self._expired)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expired(self) -> None:
            self._timer = None
            if not self.transport.is_closing():
                on_timeout()
                self.transport.close()

    return HeaderDeadline
