"""One served artifact: its embedder with the per-input token cap applied, its lanes, its card."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..backends.catalogue import session_backend
from ..runtime import Embedder
from .batcher import Batcher
from .config import ServeConfig
from .lanes import Lanes
from .metrics import Metrics


@dataclass
class ServedModel:
    """What the routes need of one model. ``max_length`` is the artifact's own limit; the
    embedder's encoder cuts (and flags) inputs at :attr:`max_input_tokens`, never above it."""

    name: str
    lanes: Lanes
    max_length: int

    @property
    def embedder(self) -> Embedder:
        return self.lanes.embedder

    @property
    def max_input_tokens(self) -> int:
        return self.embedder.max_length

    def card(self, created: int) -> dict[str, Any]:
        """This model in ``GET /v1/models``."""
        embedder = self.embedder
        return {
            "id": self.name, "object": "model", "created": created, "owned_by": "kvembed",
            "method": embedder.method.name, "dim": embedder.dim, "max_length": self.max_length,
            "max_input_tokens": self.max_input_tokens, "outputs": embedder.outputs,
            # what --provider (auto: kvembed.backends.catalogue.choose_backend) runs it on, and why
            "target": embedder.target, "backend": session_backend(embedder.session), "backend_reason": embedder.choice.reason if embedder.choice else "",
        }


def input_cap(config: ServeConfig, max_length: int) -> int:
    """Tokens one input may have on this server: ``--max-input-tokens``, at most the artifact's max_length."""
    return min(config.max_input_tokens, max_length)


def serve_model(name: str, embedder: Embedder, metrics: Metrics, config: ServeConfig) -> ServedModel:
    """Cap ``embedder``'s inputs (it is the server's own) and give it its lanes, not yet started."""
    max_length = embedder.max_length
    embedder.cap_input_tokens(input_cap(config, max_length))  # encode_one / token_inputs cut and flag at the cap

    def lane(label: str, nice: int = 0) -> Batcher:
        return Batcher(embedder, name, metrics, config.policy(embedder.policy), config.max_wait_ms, config.workers,
                       lane=label, nice=nice)

    long_tokens = config.long_input_tokens
    if long_tokens is None or long_tokens >= embedder.max_length:  # no input can be long
        return ServedModel(name, Lanes(lane("")), max_length)
    return ServedModel(name, Lanes(lane("short"), lane("long", config.long_lane_nice), long_tokens), max_length)
