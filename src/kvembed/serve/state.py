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
    load_error: str | None = None
    in_flight: int = 0
    created: int = field(default_factory=lambda: int(time.time()))

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
