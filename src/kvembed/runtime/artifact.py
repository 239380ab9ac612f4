"""The artifact's text encoder: the runtime's :class:`TextEncoder` rebuilt from ``tokenizer.json``
and the typed manifest, torch-free, exactly as the exporter's parity gate tokenised."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..artifact import TOKENIZER, Manifest
from .encoding import TextEncoder
from ..errors import InvalidInput


def encoder_from_manifest(directory: str | os.PathLike[str], manifest: Manifest) -> TextEncoder:
    """Rebuild the artifact's TextEncoder from ``tokenizer.json`` in ``directory`` and the manifest
    (torch-free). The manifest is the one the caller loaded (the exporter's draft, for a staged
    artifact whose manifest is not written yet)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(directory) / TOKENIZER))
    context: dict[str, Any] = {}
    if manifest.context_encoder is not None:
        spec = manifest.context_encoder
        context = {
            "context_tokenizer": Tokenizer.from_file(str(Path(directory) / spec.tokenizer)),
            "context_max_length": spec.max_length,
            "context_pad_id": spec.pad_id,
        }
    encoder = TextEncoder(
        tokenizer, manifest.method, manifest.max_length, fallback_id=manifest.fallback_id, pad_id=manifest.pad_id,
        padding_side=manifest.padding_side, **context
    )
    if manifest.method.placeholder and encoder.placeholder_id != manifest.placeholder_id:
        raise InvalidInput(
            f"tokenizer.json gives the placeholder id {encoder.placeholder_id}, the manifest says {manifest.placeholder_id}"
        )
    return encoder
