"""Causal2Vec's torch side: the Contextual token, and loading a checkpoint's models.

:class:`ContextEncoder` is the bidirectional encoder, mean-pooled over its real tokens, then the
MLP ``Linear(k, d) -> GELU -> Linear(d, d)`` into the LLM's word-embedding space (Lin et al.,
eq. 1). :class:`~kvembed.modeling.patch.model.EmbeddingModel` puts its output in place of the prompt's
placeholder token, so the reference and the exported graph compute it in the same module.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..causal2vec import Causal2VecCheckpoint
from .model import masked_mean
from ...errors import InvalidInput
from ...extras import install_hint


class ContextEncoder(nn.Module):
    """Text (encoder token ids and mask) -> the Contextual token ``[batch, d]``."""

    def __init__(self, encoder: nn.Module, fc1: nn.Linear, fc2: nn.Linear) -> None:
        super().__init__()
        self.encoder, self.fc1, self.fc2 = encoder, fc1, fc2
        self.act = nn.GELU()  # exact (erf) GELU, as torch.nn.GELU defaults to

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.fc2(self.act(self.fc1(masked_mean(hidden, attention_mask))))


def load_context_encoder(checkpoint: Causal2VecCheckpoint, dtype: torch.dtype = torch.float32) -> ContextEncoder:
    """The checkpoint's encoder and projector as one module (eval mode)."""
    from safetensors.torch import load_file
    from transformers import AutoModel

    from ..quiet import quiet_transformers

    extra = {"add_pooling_layer": False} if _is_bert_like(checkpoint) else {}
    with quiet_transformers():  # a pre-training checkpoint's unused heads are expected
        encoder = AutoModel.from_pretrained(str(checkpoint.encoder), dtype=dtype, **extra)
    weights = load_file(str(checkpoint.projector))
    d, k = checkpoint.llm_hidden, checkpoint.encoder_hidden
    fc1, fc2 = nn.Linear(k, d), nn.Linear(d, d)
    fc1.load_state_dict({"weight": weights["fc1.weight"], "bias": weights["fc1.bias"]})
    fc2.load_state_dict({"weight": weights["fc2.weight"], "bias": weights["fc2.bias"]})
    return ContextEncoder(encoder, fc1, fc2).to(dtype).eval()


def _is_bert_like(checkpoint: Causal2VecCheckpoint) -> bool:
    """BERT-family models build an unused pooler unless told not to."""
    import json

    config = json.loads((checkpoint.encoder / "config.json").read_text(encoding="utf-8"))
    return config.get("model_type") in ("bert", "roberta", "xlm-roberta", "camembert")


def load_llm(checkpoint: Causal2VecCheckpoint, dtype: torch.dtype = torch.float32) -> Any:
    """The checkpoint's decoder, with ``adapter/`` (a peft LoRA) merged into it when present."""
    from transformers import AutoModel, AutoModelForCausalLM

    from ..quiet import quiet_transformers

    with quiet_transformers():
        if checkpoint.adapter is None:
            return AutoModel.from_pretrained(str(checkpoint.llm), dtype=dtype)
        try:
            from peft import PeftModel
        except ImportError as err:
            from ...errors import MissingDependency

            raise MissingDependency(
                f"{checkpoint.root}/adapter is a LoRA adapter, and merging it needs peft: {install_hint('causal2vec')}"
            ) from err
        base = AutoModelForCausalLM.from_pretrained(str(checkpoint.llm), dtype=dtype)
        try:
            merged = PeftModel.from_pretrained(base, str(checkpoint.adapter)).merge_and_unload()
        except (ValueError, KeyError, OSError) as err:
            raise InvalidInput(f"{checkpoint.root}/adapter is not a peft adapter of llm/ ({type(err).__name__}: {err})") from None
        return merged
