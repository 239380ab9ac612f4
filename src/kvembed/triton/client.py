"""Thin tritonclient calls on a kvembed model repository's ensemble: texts in (``TEXT``, and
``KIND`` for a method that prompts queries and documents apart), float32 outputs back, over HTTP or
gRPC. What a benchmark or a check of a running Triton server sends, the way a user's client does."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def client_module(protocol: str) -> Any:
    """tritonclient's ``http`` or ``grpc`` module (``protocol``: "http" or anything else for gRPC)."""
    if protocol == "http":
        import tritonclient.http as module
    else:
        import tritonclient.grpc as module
    return module


def make_client(protocol: str, server: Any, **kwargs: Any) -> Any:
    """An ``InferenceServerClient`` of ``server`` (a :class:`~kvembed.triton.server.TritonServer`)."""
    module = client_module(protocol)
    return module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url, **kwargs)


def bytes_input(module: Any, name: str, values: Sequence[bytes | str]) -> Any:
    """A ``[n, 1]`` BYTES input of UTF-8 strings, as the ensemble's ``TEXT`` and ``KIND`` take."""
    array = np.array([[v.encode("utf-8") if isinstance(v, str) else v] for v in values], dtype=object).reshape(len(values), 1)
    tensor = module.InferInput(name, list(array.shape), "BYTES")
    tensor.set_data_from_numpy(array)
    return tensor


def infer(client: Any, protocol: str, model: str, texts: Sequence[bytes | str], kind: str | None = None,
          outputs: Sequence[str] = ("embedding",)) -> dict[str, np.ndarray]:
    """Embed ``texts`` through ``model``; returns {output: float32 array}."""
    module = client_module(protocol)
    inputs = [bytes_input(module, "TEXT", texts)]
    if kind is not None:
        inputs.append(bytes_input(module, "KIND", [kind] * len(texts)))
    requested = [module.InferRequestedOutput(name) for name in outputs]
    result = client.infer(model, inputs, outputs=requested)
    return {name: result.as_numpy(name) for name in outputs}
