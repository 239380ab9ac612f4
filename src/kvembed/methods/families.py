"""The table of the families kvembed exports and the trained embedders it knows, as README and the
docs print it: made from the architecture table (:data:`~.architectures.SUPPORTED`) and the
aliases (:data:`~.models.TRAINED_EMBEDDERS`), so a new entry shows up without anyone editing a
page; what proves each family beyond the independent oracle is said here, beside its name.
"""

from __future__ import annotations

from typing import Mapping

from .architectures import SUPPORTED
from .models import TRAINED_EMBEDDERS

#: model_type -> the family's name as its model cards write it
NAMES: Mapping[str, str] = {
    "llama": "Llama (Llama 2 / 3, SmolLM2)",
    "mistral": "Mistral",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "gemma3_text": "Gemma 3",
    "granite": "Granite",
    "olmo2": "OLMo 2",
    "phi3": "Phi-3",
    "stablelm": "StableLM 2",
    "cohere": "Cohere (Command-R)",
    "gemma2": "Gemma 2",
}

#: model_type -> what proves it besides the oracle: a real checkpoint against plain transformers,
#: a trained embedder's folder (of its shape) against sentence-transformers
CHECKED: Mapping[str, tuple[str, ...]] = {
    "llama": ("transformers on SmolLM2-135M's real weights", "sentence-transformers on a mean-pooled folder"),
    "gemma3_text": ("transformers on Gemma 3 270M's real weights",),
    "qwen3": ("sentence-transformers on a Qwen3-Embedding-shaped folder",),
    "qwen2": ("sentence-transformers on a gte-Qwen2-shaped folder",),
    "mistral": ("sentence-transformers on an e5-mistral-shaped folder",),
}

#: alias of :data:`TRAINED_EMBEDDERS` -> its decoder's model_type
TRAINED_FAMILY: Mapping[str, str] = {
    "qwen3-embedding-0.6b": "qwen3",
    "qwen3-embedding-4b": "qwen3",
    "qwen3-embedding-8b": "qwen3",
    "gte-qwen2-1.5b-instruct": "qwen2",
    "gte-qwen2-7b-instruct": "qwen2",
    "e5-mistral-7b-instruct": "mistral",
    "sfr-embedding-mistral": "mistral",
}

ORACLE = "the independent float64 oracle, every method"


def families_markdown() -> str:
    """The families table: name, ``model_type``, GGUF, and what proves it."""
    rows = ["| family | `model_type` | GGUF (llama.cpp's name) | proven against |", "|---|---|---|---|"]
    for model_type, arch in SUPPORTED.items():
        gguf = f"`{arch.gguf_name}`" if arch.gguf_loadable else f"`{arch.gguf_name}`: refused (transformers cannot convert it)"
        proofs = "; ".join((ORACLE, *CHECKED.get(model_type, ())))
        rows.append(f"| {NAMES.get(model_type, model_type)} | `{model_type}` | {gguf} | {proofs} |")
    return "\n".join(rows)


def trained_markdown() -> str:
    """The trained embedders table: alias, hub id, family (exported as the ``st`` method)."""
    rows = ["| alias (`st` method) | hub id | family |", "|---|---|---|"]
    for alias, hub_id in TRAINED_EMBEDDERS.items():
        family = TRAINED_FAMILY.get(alias, "")
        rows.append(f"| `{alias}` | `{hub_id}` | {NAMES.get(family, family)} |")
    return "\n".join(rows)


def tables_markdown() -> str:
    """Both tables, as README and the docs print them between their markers."""
    return families_markdown() + "\n\nTrained decoder embedders, exported from their sentence-transformers folder:\n\n" + trained_markdown()
