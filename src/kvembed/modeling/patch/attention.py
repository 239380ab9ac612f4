"""The attention function behind KV re-routing, registered with transformers' interfaces.

transformers 5 lets a model dispatch attention through ``AttentionInterface``; we register
``"kvembed"`` there (and an ``AttentionMaskInterface`` entry, without which the padding mask
would be silently dropped). Layers without re-routing run plain SDPA; layers in the re-routing
set get the prefix key/value column prepended and their logit bias folded into the mask. A model
whose attention soft-caps its logits (Gemma 2 passes ``softcap``) runs transformers' eager
attention of that family instead, since SDPA has no cap: the mask, the prefix's bias included, is
added after the cap.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as softcapped_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask

ATTENTION_NAME = "kvembed"


@dataclass
class PrefixInputs:
    """Per-forward tensors of the re-routed prefix, shared by every re-routed layer.

    ``index`` (batch, n): sequence positions whose key/value are prepended, in order;
    ``mask`` (batch, 1, 1, n): additive logit term, the bias where the position is real and
    the dtype minimum where it is not (a text shorter than ``num_prefix``);
    ``cos``/``sin`` (batch, n, rotary width): RoPE of those positions, unscaled, to undo the
    rotation when the prefix key goes to position 0 (``prefix_rope="zero"``), else None; the
    rotary width is head_dim, or its first part under a partial rotary factor (Phi-3);
    ``rope_by_type``: for models whose layer kinds rotate differently (Gemma 3's sliding and full
    attention layers), ``layer_type -> (cos, sin)`` in place of ``cos``/``sin``;
    ``interleaved``: RoPE turned adjacent feature pairs, not a head's halves (the entry's
    ``rope_interleaved``, Cohere), so the inverse rotation pairs them the same way.

    In a sliding-window layer the prefix is still one extra column with its own mask, so every
    query sees it whatever its distance from the last token: the window limits only the
    sequence's own keys.
    """

    index: torch.Tensor
    mask: torch.Tensor
    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None
    rope_by_type: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None
    interleaved: bool = False

    def rope_for(self, module: torch.nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The (cos, sin) that rotated ``module``'s keys, or (None, None) to keep the rotation."""
        if self.rope_by_type is not None:
            return self.rope_by_type[module.layer_type]
        return self.cos, self.sin


def _rotate_half(x: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """The quarter turn RoPE pairs with the cosine: of a head's halves, or of each adjacent pair."""
    if interleaved:
        return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def prefix_key_values(
    key: torch.Tensor, value: torch.Tensor, prefix: PrefixInputs, module: torch.nn.Module | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather the prefix key/value (batch, kv_heads, n, head_dim) from the layer's own K and V."""
    batch, heads, _, dim = key.shape
    index = prefix.index[:, None, :, None].expand(batch, heads, prefix.index.shape[1], dim)
    k, v = key.gather(2, index), value.gather(2, index)
    cos, sin = prefix.rope_for(module) if module is not None else (prefix.cos, prefix.sin)
    if cos is not None and sin is not None:
        # inverse rotation R(-theta) k = k cos - rotate_half(k) sin -> the key as if at position 0,
        # on the features RoPE turned (all of them, or the first part under a partial rotary factor)
        width = cos.shape[-1]
        turned = k[..., :width] * cos[:, None] - _rotate_half(k[..., :width], prefix.interleaved) * sin[:, None]
        k = turned if width == k.shape[-1] else torch.cat((turned, k[..., width:]), dim=-1)
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
    """SDPA (eager with a ``softcap``), plus the re-routed prefix column on modules flagged ``kvembed_reroute``."""
    if kvembed_prefix is not None and getattr(module, "kvembed_reroute", False):
        if attention_mask is None:
            raise RuntimeError("kvembed attention needs the float mask from its AttentionMaskInterface entry")
        pk, pv = prefix_key_values(key, value, kvembed_prefix, module)
        key = torch.cat((pk, key), dim=2)
        value = torch.cat((pv, value), dim=2)
        prefix_mask = kvembed_prefix.mask.to(attention_mask.dtype).expand(-1, -1, query.shape[2], -1)
        attention_mask = torch.cat((prefix_mask, attention_mask.expand(query.shape[0], -1, -1, -1)), dim=-1)
    if kwargs.get("softcap") is not None:
        return softcapped_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register() -> str:
    """Register the attention function and its (float, never-skipped) mask; idempotent."""
    AttentionInterface.register(ATTENTION_NAME, kvembed_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, eager_mask)
    return ATTENTION_NAME
