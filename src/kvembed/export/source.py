"""The source model of an export: loading its PyTorch reference, and the record of where it came
from (location, config hash, stored dtype, GGUF or Causal2Vec facts) that the manifest keeps and
``verify`` compares with a fresh reference's. A leaf of the export room: the pipeline and the gate
both read it.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

from ..errors import InvalidInput
from ..methods.architectures import sliding_window


def load_embedder(
    model: Any,
    method: str = "kv-embedding",
    *,
    max_length: int | None = None,
    padding_side: str = "right",
    **options: Any,
) -> Any:
    """A :class:`~kvembed.modeling.reference.TorchEmbedder` (fp32) for ``model`` and ``method``."""
    from transformers.utils import logging as hf_logging

    from ..modeling.reference import TorchEmbedder

    if padding_side not in ("right", "left"):
        raise InvalidInput(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    hf_logging.disable_progress_bar()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TorchEmbedder.from_pretrained(
            model, method, max_length=max_length, padding_side=padding_side, **options
        )


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
    if getattr(embedder, "second_reference", None):
        record["second_reference"] = dict(embedder.second_reference)  # sentence-transformers on the folder (st)
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
