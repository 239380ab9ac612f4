"""An adapter implementing mteb v2's ``EncoderProtocol`` over any kvembed embedder.

mteb itself (torch, datasets, sentence-transformers, ...) is not a kvembed dependency: the adapter
only needs it for :attr:`MTEBEncoder.mteb_model_meta`. Everything else follows the protocol's
shapes: ``encode`` takes an iterable of batches (mteb passes a ``DataLoader[BatchedInput]``, i.e.
dicts with a ``"text"`` list) or a plain list of str, maps ``prompt_type`` to kvembed's query/document prompts and
returns a float32 numpy array.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from ..errors import InvalidInput
from .vectors import unit_rows

#: mteb's PromptType values -> kvembed kinds; no prompt type means a symmetric task: documents
PROMPT_KINDS = {"query": "query", "document": "document", "passage": "document", None: "document"}


class MTEBEncoder:
    """Wraps an object with ``encode(texts, kind=..., batch_size=...)`` (the runtime ``Embedder``
    or the reference ``TorchEmbedder``) for mteb."""

    def __init__(self, embedder: Any, name: str | None = None, batch_size: int = 32) -> None:
        self.embedder = embedder
        self.name = name or f"kvembed/{embedder.method.name}"
        self.batch_size = batch_size

    def encode(
        self,
        inputs: Iterable[Mapping[str, Any]],
        *,
        task_metadata: Any = None,
        hf_split: str | None = None,
        hf_subset: str | None = None,
        prompt_type: Any = None,
        **kwargs: Any,
    ) -> np.ndarray:
        kind = PROMPT_KINDS.get(getattr(prompt_type, "value", prompt_type))
        if kind is None:
            raise InvalidInput(f"unknown prompt_type {prompt_type!r}; expected query, document or None")
        texts = _texts_of(inputs)
        batch_size = int(kwargs.get("batch_size", self.batch_size))
        return self.embedder.encode(texts, kind=kind, batch_size=batch_size)

    def similarity(self, embeddings1: Any, embeddings2: Any) -> np.ndarray:
        """Cosine similarity matrix [n1, n2]."""
        a, b = unit_rows(embeddings1), unit_rows(embeddings2)
        return a @ b.T

    def similarity_pairwise(self, embeddings1: Any, embeddings2: Any) -> np.ndarray:
        """Cosine similarity of corresponding rows [n]."""
        a, b = unit_rows(embeddings1), unit_rows(embeddings2)
        if a.shape != b.shape:
            raise InvalidInput(f"pairwise similarity needs equal shapes, got {a.shape} and {b.shape}")
        return (a * b).sum(axis=-1)

    @property
    def mteb_model_meta(self) -> Any:
        try:
            from mteb.models.model_meta import ModelMeta
        except ImportError as err:
            raise ImportError(f"mteb_model_meta needs mteb: pip install mteb ({err})") from None
        return ModelMeta(
            loader=None,
            name=self.name,
            revision=None,
            release_date=None,
            languages=None,
            n_parameters=None,
            memory_usage_mb=None,
            max_tokens=self.embedder.max_length,
            embed_dim=self.embedder.dim,
            license=None,
            open_weights=True,
            public_training_code=None,
            public_training_data=None,
            similarity_fn_name="cosine",
            framework=["ONNX"],
            reference=None,
            use_instructions=False,
            training_datasets=None,
        )


def _texts_of(inputs: Any) -> list[str]:
    """The texts of mteb's batches (dicts with a ``"text"`` list), or of a plain list of str / a
    single str, as mteb's own wrappers accept."""
    if isinstance(inputs, str):
        return [inputs]
    texts: list[str] = []
    for batch in inputs:
        if isinstance(batch, str):
            texts.append(batch)
        elif isinstance(batch, Mapping) and "text" in batch:
            texts.extend(batch["text"])
        elif isinstance(batch, Mapping):
            raise InvalidInput(f"kvembed embeds text only; got a batch with keys {sorted(batch)}")
        else:
            raise TypeError(f"expected batches with a 'text' list or plain str items, got {type(batch).__name__}")
    return texts
