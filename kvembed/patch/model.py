"""The patched model: a Hugging Face decoder plus readout, pooling and normalisation.

:class:`EmbeddingModel` maps ``(input_ids, attention_mask[, pool_mask])`` to L2-normalised
embeddings. Its :meth:`~EmbeddingModel.patched` context manager applies a method to the wrapped
decoder (attention implementation, re-routing flags, hooks, layer truncation) and restores it
afterwards. The PyTorch reference runs it eagerly; the exporter traces the very same module.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ..methods.spec import ResolvedMethod
from . import attention
from .architectures import architecture_of, base_model
from .attention import PrefixInputs


def last_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last real token, whatever the padding side."""
    positions = torch.arange(mask.shape[1], device=mask.device, dtype=mask.dtype)
    return (positions[None, :] * mask).argmax(dim=-1)


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[b, index[b]]`` for (batch, seq, dim) ``x``, as a Gather (ONNX- and TensorRT-friendly)."""
    return x.gather(1, index[:, None, None].expand(-1, 1, x.shape[-1]))[:, 0]


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over positions where ``mask`` is set; padded positions are selected out (not multiplied
    by zero), so a non-finite value there (fully masked rows in fp16) cannot leak in."""
    keep = mask.bool()[..., None]
    total = torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim=1)
    return total / keep.sum(dim=1).clamp(min=1).to(x.dtype)


class EmbeddingModel(nn.Module):
    """A decoder-only LLM computing one :class:`ResolvedMethod`'s embedding."""

    def __init__(self, model: nn.Module, method: ResolvedMethod, placeholder_id: int | None = None) -> None:
        super().__init__()
        self.decoder = base_model(model)
        self.architecture = architecture_of(self.decoder.config)
        if method.num_layers != len(self.decoder.layers):
            raise ValueError(
                f"method was resolved for {method.num_layers} layers but the model has {len(self.decoder.layers)}"
            )
        if method.placeholder and placeholder_id is None:
            raise ValueError(f"method {method.name!r} needs the placeholder token id")
        self.method = method
        self.placeholder_id = placeholder_id
        self._captures: list[torch.Tensor] = []
        self._rewire: dict[str, torch.Tensor] = {}
        self._active = False

    # -- shape facts -------------------------------------------------------------------------

    @property
    def output_dim(self) -> int:
        config = self.decoder.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        if self.method.readout == "values":
            return config.num_key_value_heads * head_dim
        if self.method.readout == "attention-output" and self.method.options.get("wva"):
            return config.num_attention_heads * head_dim
        return config.hidden_size

    @property
    def uses_pool_mask(self) -> bool:
        return self.method.uses_pool_mask

    # -- patching ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def patched(self) -> Iterator["EmbeddingModel"]:
        """Apply the method to the decoder for the duration of the block, then restore it."""
        if self._active:
            yield self
            return
        decoder, method = self.decoder, self.method
        config = decoder.config
        full_layers = decoder.layers
        saved_attn = config._attn_implementation
        handles: list[Any] = []
        rerouted: list[nn.Module] = []
        try:
            config._attn_implementation = attention.register()
            kept = list(full_layers)[: method.layers_needed]
            decoder.layers = nn.ModuleList(kept)
            if method.reroute:
                for index in method.layers:
                    kept[index].self_attn.kvembed_reroute = True
                    rerouted.append(kept[index].self_attn)
            handles.extend(self._install_readout_hooks(kept))
            if method.placeholder:
                window = range(int(method.options["tp_start"]), int(method.options["tp_stop"]))
                handles.extend(kept[i].register_forward_pre_hook(self._rewire_hook, with_kwargs=True) for i in window)
            self._active = True
            yield self
        finally:
            self._active = False
            for handle in handles:
                handle.remove()
            for module in rerouted:
                del module.kvembed_reroute
            decoder.layers = full_layers
            config._attn_implementation = saved_attn

    def _install_readout_hooks(self, kept: list[nn.Module]) -> list[Any]:
        method = self.method

        def capture_output(module: nn.Module, args: Any, output: Any) -> None:
            self._captures.append(output[0] if isinstance(output, tuple) else output)

        def capture_input(module: nn.Module, args: Any) -> None:
            self._captures.append(args[0])

        if method.readout == "values":
            return [kept[i].self_attn.v_proj.register_forward_hook(capture_output) for i in method.layers]
        if method.readout == "attention-output":
            if method.options.get("wva"):
                return [kept[i].self_attn.o_proj.register_forward_pre_hook(capture_input) for i in method.layers]
            return [kept[i].self_attn.o_proj.register_forward_hook(capture_output) for i in method.layers]
        if method.readout == "residual":
            return [kept[-1].register_forward_hook(capture_output)]
        return []

    def _rewire_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Token prepending: the placeholder position takes the last real token's residual state."""
        hidden = args[0] if args else kwargs["hidden_states"]
        last = gather_rows(hidden, self._rewire["last"])[:, None, :]
        hidden = torch.where(self._rewire["is_placeholder"][..., None], last, hidden)
        if args:
            return (hidden, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": hidden}

    # -- forward -----------------------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pool_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(embedding, pooled)``: the L2-normalised vector and the raw one it came from."""
        if not self._active:
            raise RuntimeError("call EmbeddingModel inside `with model.patched():`")
        method = self.method
        mask = attention_mask.to(torch.int64)
        last = last_index(mask)
        position_ids = (mask.cumsum(dim=-1) - 1).clamp(min=0)

        ids = input_ids
        is_placeholder = None
        if self.placeholder_id is not None:
            is_placeholder = input_ids == self.placeholder_id
            ids = torch.where(is_placeholder, torch.zeros_like(input_ids), input_ids)
        embeds = self.decoder.embed_tokens(ids)
        if is_placeholder is not None:  # the placeholder's input embedding is the zero vector
            embeds = embeds * (~is_placeholder)[..., None].to(embeds.dtype)
            self._rewire = {"last": last, "is_placeholder": is_placeholder}

        extra: dict[str, Any] = {}
        if method.reroute:
            extra["kvembed_prefix"] = self._prefix_inputs(mask, last, position_ids, embeds)
        self._captures = []
        try:
            output = self.decoder(
                inputs_embeds=embeds,
                attention_mask=mask,
                position_ids=position_ids,
                use_cache=False,
                **extra,
            )
            pooled = self._readout(output.last_hidden_state, mask, last, pool_mask)
        finally:
            self._captures = []
            self._rewire = {}
        return F.normalize(pooled, dim=-1), pooled

    def _prefix_inputs(
        self, mask: torch.Tensor, last: torch.Tensor, position_ids: torch.Tensor, embeds: torch.Tensor
    ) -> PrefixInputs:
        options = self.method.options
        n = int(options["num_prefix"])
        offsets = torch.arange(1 - n, 1, device=mask.device, dtype=last.dtype)
        index = last[:, None] + offsets[None, :]
        valid = index >= 0
        index = index.clamp(min=0)
        valid = valid & (mask.gather(1, index) == 1)
        low = torch.finfo(embeds.dtype).min
        bias = torch.full((), float(options["bias"]), dtype=embeds.dtype, device=embeds.device)
        prefix_mask = torch.where(valid, bias, low)[:, None, None, :]
        cos = sin = None
        if options["prefix_rope"] == "zero":
            rotary = self.decoder.rotary_emb
            cos, sin = rotary(embeds, position_ids.gather(1, index))
            scale = float(getattr(rotary, "attention_scaling", 1.0))
            cos, sin = cos / scale, sin / scale
        return PrefixInputs(index=index, mask=prefix_mask, cos=cos, sin=sin)

    def _readout(
        self,
        hidden: torch.Tensor,
        mask: torch.Tensor,
        last: torch.Tensor,
        pool_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        method = self.method
        if method.readout == "values":
            return torch.stack([masked_mean(v, mask) for v in self._captures]).mean(dim=0)
        if method.readout == "attention-output":
            return torch.stack([gather_rows(a, last) for a in self._captures]).mean(dim=0)
        if method.readout == "residual":
            return gather_rows(self._captures[-1], last)
        pooling = method.pooling
        if pooling == "last":
            return gather_rows(hidden, last)
        if pooling == "mean":
            return masked_mean(hidden, mask)
        if pooling == "last-mean":
            return (gather_rows(hidden, last) + masked_mean(hidden, mask)) / 2
        if pooling == "span":
            if pool_mask is None:
                raise ValueError(f"method {method.name!r} needs a pool_mask input")
            return masked_mean(hidden, pool_mask * mask)
        raise ValueError(f"unknown pooling {pooling!r}")
