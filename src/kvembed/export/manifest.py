"""What an artifact's manifest says about its making: the source model (location, config hash,
stored dtype, GGUF or Causal2Vec facts), the method, the inputs and outputs, and the graph.

``verify`` compares a fresh reference's :func:`source_record` with the one written here.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

from ..version import __version__
from ..methods.architectures import sliding_window
from ..methods.sharing import output_names
from ..artifact import ENCODER_TOKENIZER, SCHEMA_VERSION
from .graph import input_axes, input_names


def source_record(embedder: Any) -> dict[str, Any]:
    """Where the model came from, and a hash of its config, for the manifest."""
    from ..methods import resolve_model

    given = embedder.source if embedder.source is not None else ""
    location, preset_id = getattr(embedder, "location", None), getattr(embedder, "preset_id", None)
    if location is None and given:  # built without from_pretrained
        location, preset_id = resolve_model(given)
    config = embedder.model.decoder.config
    record: dict[str, Any] = {
        "model": given, "location": None, "preset_id": preset_id, "revision": getattr(embedder, "revision", None)
    }
    if location is not None and Path(location).is_dir():
        record["location"] = str(Path(location).resolve())
    elif location is not None:
        record["location"] = location  # a hub id
    record["model_type"] = config.model_type
    record["config_sha256"] = config_hash(location, config)
    record["num_layers"] = int(config.num_hidden_layers)
    record["hidden_size"] = int(config.hidden_size)
    record["sliding_window"] = sliding_window(config)  # the gate ran one text past it (None: no window)
    # the dtype the checkpoint's weights are stored in (bfloat16 for most 4B-8B releases); the
    # export itself traces and checks in float32
    record["dtype"] = getattr(embedder, "source_dtype", None)
    if getattr(embedder, "gguf", None):
        record["gguf"] = dict(embedder.gguf)  # file name, sha256, quantization type, architecture
    if getattr(embedder, "causal2vec", None):
        record["causal2vec"] = dict(embedder.causal2vec)  # encoder, projector sha256, adapter merged
    return record


def config_hash(location: str | None, config: Any) -> str:
    """sha256 of the model folder's ``config.json`` bytes, else of the config as canonical JSON."""
    if location is not None:
        path = Path(location) / "config.json"
        if path.is_file():
            return hashlib.sha256(path.read_bytes()).hexdigest()
    data = config.to_dict()
    data.pop("transformers_version", None)
    data.pop("_attn_implementation_autoset", None)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def build_manifest(
    embedder: Any, traced: Mapping[str, Any], opset: int, precision: str, graph_facts: Mapping[str, Any],
    conversion: Mapping[str, Any],
) -> dict[str, Any]:
    """The manifest of ``embedder``'s graph for ``precision``, before its files and parity are known.

    ``traced`` holds the trace's facts (exporter, attention form, optimizations); ``graph_facts``
    the checks' (:func:`~kvembed.export.checks.check_graph`); ``conversion`` the precision's."""
    import onnx
    import onnxruntime
    import torch
    import transformers

    encoder = embedder.encoder
    names = input_names(embedder)
    model = embedder.model
    graph = {
        "exporter": traced["exporter"],
        # fused (one Attention op per layer, opset 23) or decomposed, and the oldest
        # onnxruntime / TensorRT that run this graph
        "attention": traced["attention"],
        "optimizations": traced["optimizations"],
        **graph_facts,
        "precision_conversion": dict(conversion),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
        },
    }
    return {
        "schema_version": SCHEMA_VERSION,
        "kvembed_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "source": source_record(embedder),
        "method": embedder.method.to_dict(),
        # layers="auto": the intrinsic-dimension curve and the set it chose (else null)
        "layer_selection": getattr(embedder, "layer_selection", None),
        "dim": int(embedder.dim),
        "max_length": int(embedder.max_length),
        "opset": opset,
        "precision": precision,
        "padding_side": embedder.padding_side,
        "placeholder_id": encoder.placeholder_id,
        "pad_id": encoder.pad_id,
        "fallback_id": encoder.fallback_id,
        "inputs": [{"name": n, "dtype": "int64", "shape": list(input_axes(n))} for n in names],
        # Causal2Vec: the context encoder's tokenizer file, length limit and pad id (else null)
        "context_encoder": None if encoder.context_tokenizer is None else {
            "tokenizer": ENCODER_TOKENIZER, "max_length": encoder.context_max_length, "pad_id": encoder.context_pad_id,
        },
        # extra methods read from the same forward pass (--also): label -> method
        "also": {label: method.to_dict() for label, method in model.also.items()},
        "outputs": [
            {
                "name": name, "dtype": "float32", "shape": ["batch", model.readout_dim(method)],
                "normalized": normalized, "method": method.name if label is None else label,
            }
            for label, method in model.readouts
            for name, normalized in zip(output_names(label), (True, False))
        ],
        "graph": graph,
        "files": {},
        "parity": {},
    }
