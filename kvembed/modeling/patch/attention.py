"""The attention function behind KV re-routing, registered with transformers' interfaces.

transformers 5 lets a model dispatch attention through ``AttentionInterface``; we register
``"kvembed"`` there (and an ``AttentionMaskInterface`` entry, without which the padding mask
would be silently dropped). Layers without re-routing run plain SDPA; layers in the re-routing
set get the prefix key/value column prepended and their logit bias folded into the mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask

ATTENTION_NAME = "kvembed"


@dataclass
class PrefixInputs:
    """Per-forward tensors of the re-routed prefix, shared by every re-routed layer.

    ``index`` (batch, n): sequence positions whose key/value are prepended, in order;
    ``mask`` (batch, 1, 1, n): additive logit term, the bias where the position is real and
    the dtype minimum where it is not (a text shorter than ``num_prefix``);
    ``cos``/``sin`` (batch, n, head_dim): RoPE of those positions, unscaled, to undo the
    rotation when the prefix key goes to position 0 (``prefix_rope="zero"``), else None.
    """

    index: torch.Tensor
    mask: torch.Tensor
    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def prefix_key_values(
    key: torch.Tensor, value: torch.Tensor, prefix: PrefixInputs
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather the prefix key/value (batch, kv_heads, n, head_dim) from the layer's own K and V."""
    batch, heads, _, dim = key.shape
    index = prefix.index[:, None, :, None].expand(batch, heads, prefix.index.shape[1], dim)
    k, v = key.gather(2, index), value.gather(2, index)
    if prefix.cos is not None and prefix.sin is not None:
        # inverse rotation R(-theta) k = k cos - rotate_half(k) sin -> the key as if at position 0
        k = k * prefix.cos[:, None] - _rotate_half(k) * prefix.sin[:, None]
    return k, v


def kvembed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    kvembed_prefix: PrefixInputs | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """SDPA, plus the re-routed prefix column on modules flagged ``kvembed_reroute``."""
    if kvembed_prefix is not None and getattr(module, "kvembed_reroute", False):
        if attention_mask is None:
            raise RuntimeError("kvembed attention needs the float mask from its AttentionMaskInterface entry")
        pk, pv = prefix_key_values(key, value, kvembed_prefix)
        key = torch.cat((pk, key), dim=2)
        value = torch.cat((pv, value), dim=2)
        prefix_mask = kvembed_prefix.mask.to(attention_mask.dtype).expand(-1, -1, query.shape[2], -1)
        attention_mask = torch.cat((prefix_mask, attention_mask.expand(query.shape[0], -1, -1, -1)), dim=-1)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register() -> str:
    """Register the attention function and its (float, never-skipped) mask; idempotent."""
    AttentionInterface.register(ATTENTION_NAME, kvembed_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, eager_mask)
    return ATTENTION_NAME
