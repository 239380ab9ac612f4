"""What the routes share: settings, metrics, the loaded artifacts, and the lifecycle flags."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..errors import shown
from .config import ServeConfig
from .errors import ApiError
from .metrics import Metrics
from .model import ServedModel


@dataclass
class ServerState:
    """The server's state: filled by the loader thread, read by every route."""

    config: ServeConfig
    metrics: Metrics = field(default_factory=Metrics)
    models: dict[str, ServedModel] = field(default_factory=dict)
    ready: bool = False
    draining: bool = False
    stop_by: float | None = None
    """When draining: the ``time.monotonic()`` past which shutdown waits for nothing (None: for everything)."""
    abandoned: int = 0
    """Graph calls still running when shutdown stopped waiting: their threads cannot be interrupted."""
    load_error: str | None = None
    in_flight: int = 0
    created: int = field(default_factory=lambda: int(time.time()))

    def drain(self, graceful_timeout: float | None) -> None:
        """Shutting down: new requests get 503; what runs has ``graceful_timeout`` seconds (None or 0: for ever)."""
        self.draining = True
        self.stop_by = time.monotonic() + graceful_timeout if graceful_timeout else None

    def time_left(self) -> float | None:
        """Seconds shutdown still waits for running work (None: no limit)."""
        return None if self.stop_by is None else max(0.0, self.stop_by - time.monotonic())

    @property
    def default_model(self) -> str:
        """The first artifact given: what a route without a model field (TEI's) serves."""
        return self.config.artifacts[0][0]

    def model(self, name: str | None) -> ServedModel:
        """The served model ``name`` (None: the default one); another name -> 404."""
        served = self.models.get(self.default_model if name is None else name)
        if served is None:
            raise ApiError(404, f"model {shown(name)} is not served here; served: {', '.join(self.models)}", param="model")
        return served
