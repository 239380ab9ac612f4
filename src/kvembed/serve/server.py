"""Run the app under uvicorn with a graceful SIGTERM: stop accepting, drain, exit 0."""

from __future__ import annotations

import contextlib
import signal
from types import FrameType
from typing import Any, Callable, Iterator

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
