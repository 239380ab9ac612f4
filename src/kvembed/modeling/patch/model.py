"""The patched model: a Hugging Face decoder plus readout, pooling and normalisation.

:class:`EmbeddingModel` maps ``(input_ids, attention_mask[, pool_mask])`` to L2-normalised
embeddings. Its :meth:`~EmbeddingModel.patched` context manager applies a method to the wrapped
decoder (attention implementation, re-routing flags, hooks, layer truncation) and restores it
afterwards. The PyTorch reference runs it eagerly; the exporter traces the very same module.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from typing import Any, Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from ...methods.sharing import sharing_problem
from ...methods.spec import ResolvedMethod
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


_DECODER_LOCKS: "weakref.WeakKeyDictionary[nn.Module, threading.RLock]" = weakref.WeakKeyDictionary()
_DECODER_LOCKS_GUARD = threading.Lock()


def decoder_lock(decoder: nn.Module) -> threading.RLock:
    """The lock of ``decoder``: patching mutates it (layer list, attention implementation, flags,
    hooks), so patched passes over one decoder -- from several threads, or from several
    EmbeddingModels sharing it -- take turns instead of corrupting each other."""
    with _DECODER_LOCKS_GUARD:
        lock = _DECODER_LOCKS.get(decoder)
        if lock is None:
            lock = _DECODER_LOCKS[decoder] = threading.RLock()
        return lock


class EmbeddingModel(nn.Module):
    """A decoder-only LLM computing one :class:`ResolvedMethod`'s embedding.

    ``also`` (label -> method) adds the embeddings of other methods read from the same forward
    pass (:mod:`kvembed.methods.sharing` decides which can be); ``forward`` then returns their
    ``(embedding, pooled)`` pairs after the main one's, in ``also``'s order.
    """

    def __init__(
        self,
        model: nn.Module,
        method: ResolvedMethod,
        placeholder_id: int | None = None,
        also: Mapping[str, ResolvedMethod] | None = None,
        context_encoder: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.decoder = base_model(model)
        self.architecture = architecture_of(self.decoder.config)
        self.also = dict(also or {})
        for other in (method, *self.also.values()):
            if other.num_layers != len(self.decoder.layers):
                raise ValueError(
                    f"method was resolved for {other.num_layers} layers but the model has {len(self.decoder.layers)}"
                )
        for label, other in self.also.items():
            problem = sharing_problem(method, other)
            if problem:
                raise ValueError(f"extra output {label!r}: {problem}")
        if method.placeholder and placeholder_id is None:
            raise ValueError(f"method {method.name!r} needs the placeholder token id")
        if method.contextual and context_encoder is None:
            raise ValueError(f"method {method.name!r} needs its context encoder (a Causal2Vec checkpoint)")
        #: Causal2Vec's encoder + projector (kvembed.modeling.patch.contextual.ContextEncoder), else None
        self.context_encoder = context_encoder if method.contextual else None
        self.method = method
        self.placeholder_id = placeholder_id
        #: readout label (None for the main method) -> tensors its hooks captured in this forward
        self._captures: dict[str | None, list[torch.Tensor]] = {}
        self._rewire: dict[str, torch.Tensor] = {}
        #: this forward's re-routed prefix, handed to each re-routed attention by :meth:`_prefix_hook`
        self._prefix: PrefixInputs | None = None
        self._active = False

    # -- shape facts -------------------------------------------------------------------------

    @property
    def readouts(self) -> list[tuple[str | None, ResolvedMethod]]:
        """``(label, method)`` of every output pair, the main method first (label None)."""
        return [(None, self.method), *self.also.items()]

    @property
    def output_dim(self) -> int:
        return self.readout_dim(self.method)

    @property
    def head_dim(self) -> int:
        return self.architecture.head_dim(self.decoder.config)

    def readout_dim(self, method: ResolvedMethod) -> int:
        config = self.decoder.config
        head_dim = self.head_dim
        if method.readout == "values":
            return config.num_key_value_heads * head_dim
        if method.readout == "attention-output" and method.options.get("wva"):
            return config.num_attention_heads * head_dim
        if method.pooling == "context-eos":
            return 2 * config.hidden_size
        return config.hidden_size

    @property
    def layers_needed(self) -> int:
        return max(method.layers_needed for _, method in self.readouts)

    @property
    def uses_pool_mask(self) -> bool:
        return any(method.uses_pool_mask for _, method in self.readouts)

    @property
    def uses_context(self) -> bool:
        """Whether the forward pass takes the context encoder's ``encoder_input_ids`` / ``encoder_attention_mask``."""
        return self.context_encoder is not None

    # -- patching ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def patched(self) -> Iterator["EmbeddingModel"]:
        """Apply the method to the decoder for the duration of the block, then restore it.

        Holds the decoder's lock (:func:`decoder_lock`) throughout: one patched block at a time."""
        with decoder_lock(self.decoder):
            if self._active:
                yield self
                return
            with self._patch():
                yield self

    @contextlib.contextmanager
    def _patch(self) -> Iterator["EmbeddingModel"]:
        decoder, method = self.decoder, self.method
        config = decoder.config
        full_layers = decoder.layers
        saved_attn = config._attn_implementation
        handles: list[Any] = []
        rerouted: list[nn.Module] = []
        try:
            config._attn_implementation = attention.register()
            kept = list(full_layers)[: self.layers_needed]
            decoder.layers = nn.ModuleList(kept)
            if method.reroute:
                for index in method.layers:
                    kept[index].self_attn.kvembed_reroute = True
                    rerouted.append(kept[index].self_attn)
                    handles.append(kept[index].self_attn.register_forward_pre_hook(self._prefix_hook, with_kwargs=True))
            for label, readout in self.readouts:
                handles.extend(self._install_readout_hooks(kept, readout, self._captures.setdefault(label, [])))
            for sink in self._captures.values():
                sink.clear()
            if method.placeholder:
                window = range(int(method.options["tp_start"]), int(method.options["tp_stop"]))
                handles.extend(kept[i].register_forward_pre_hook(self._rewire_hook, with_kwargs=True) for i in window)
            self._active = True
            yield self
        finally:
            # a block left open until the interpreter exits is closed while torch is torn down:
            # nothing is left to restore then (and torch's setattr would fail)
            if not sys.is_finalizing():
                self._active = False
                for handle in handles:
                    handle.remove()
                for module in rerouted:
                    del module.kvembed_reroute
                decoder.layers = full_layers
                config._attn_implementation = saved_attn

    def _install_readout_hooks(self, kept: list[nn.Module], method: ResolvedMethod, sink: list[torch.Tensor]) -> list[Any]:
        """Hooks appending what ``method`` reads to ``sink`` (emptied before every forward)."""

        def capture_output(module: nn.Module, args: Any, output: Any) -> None:
            sink.append(output[0] if isinstance(output, tuple) else output)

        def capture_input(module: nn.Module, args: Any) -> None:
            sink.append(args[0])

        if method.readout == "values":
            return [self._values_hook(kept[i].self_attn, sink) for i in method.layers]
        if method.readout == "attention-output":
            if method.options.get("wva"):
                return [kept[i].self_attn.o_proj.register_forward_pre_hook(capture_input) for i in method.layers]
            return [kept[i].self_attn.o_proj.register_forward_hook(capture_output) for i in method.layers]
        if method.readout == "residual":
            return [kept[int(method.options["exit_layer"]) - 1].register_forward_hook(capture_output)]
        return []

    def _values_hook(self, attention: nn.Module, sink: list[torch.Tensor]) -> Any:
        """The hook reading one layer's values: ``v_proj``'s output, or the v part (last) of a
        fused ``qkv_proj``'s (:attr:`Architecture.fused_qkv`)."""
        if not self.architecture.fused_qkv:
            return attention.v_proj.register_forward_hook(lambda module, args, output: sink.append(output))
        width = self.decoder.config.num_key_value_heads * self.head_dim
        return attention.qkv_proj.register_forward_hook(lambda module, args, output: sink.append(output[..., -width:]))

    def _prefix_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """KV re-routing: the attention module gets this forward's prefix as a keyword argument
        straight, not through the decoder (StableLM's layer drops the keywords it was given)."""
        return args, {**kwargs, "kvembed_prefix": self._prefix}

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
        encoder_input_ids: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """Return ``(embedding, pooled)``: the L2-normalised vector and the raw one it came from,
        followed by the same pair for every ``also`` method.

        Causal2Vec: ``pool_mask`` flags each row's placeholder, whose input embedding becomes the
        context encoder's Contextual token for ``encoder_input_ids`` / ``encoder_attention_mask``."""
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
        if self.context_encoder is not None:
            if pool_mask is None or encoder_input_ids is None or encoder_attention_mask is None:
                raise ValueError(f"method {method.name!r} needs pool_mask, encoder_input_ids and encoder_attention_mask")
            context = self.context_encoder(encoder_input_ids, encoder_attention_mask.to(torch.int64)).to(embeds.dtype)
            embeds = torch.where(pool_mask.bool()[..., None], context[:, None, :], embeds)

        self._prefix = self._prefix_inputs(mask, last, position_ids, embeds) if method.reroute else None
        for sink in self._captures.values():
            sink.clear()
        try:
            output = self.decoder(
                inputs_embeds=embeds,
                attention_mask=mask,
                position_ids=position_ids,
                use_cache=False,
            )
            results: list[torch.Tensor] = []
            for label, readout in self.readouts:
                pooled = self._readout(readout, self._captures[label], output.last_hidden_state, mask, last, pool_mask)
                results.extend((F.normalize(pooled, dim=-1), pooled))
        finally:
            for sink in self._captures.values():
                sink.clear()
            self._rewire = {}
            self._prefix = None
        return tuple(results)

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
        if options["prefix_rope"] != "zero":
            return PrefixInputs(index=index, mask=prefix_mask)
        rotary, positions = self.decoder.rotary_emb, position_ids.gather(1, index)
        if not self.architecture.per_layer_rope:
            cos, sin = rotary(embeds, positions)
            scale = float(getattr(rotary, "attention_scaling", 1.0))
            return PrefixInputs(index=index, mask=prefix_mask, cos=cos / scale, sin=sin / scale,
                                interleaved=self.architecture.rope_interleaved)
        by_type = {}
        for layer_type in sorted(set(self.decoder.config.layer_types)):
            cos, sin = rotary(embeds, positions, layer_type)
            scale = float(getattr(rotary, f"{layer_type}_attention_scaling", 1.0))
            by_type[layer_type] = (cos / scale, sin / scale)
        return PrefixInputs(index=index, mask=prefix_mask, rope_by_type=by_type, interleaved=self.architecture.rope_interleaved)

    @staticmethod
    def _readout(
        method: ResolvedMethod,
        captures: list[torch.Tensor],
        hidden: torch.Tensor,
        mask: torch.Tensor,
        last: torch.Tensor,
        pool_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        if method.readout == "values":
            return torch.stack([masked_mean(v, mask) for v in captures]).mean(dim=0)
        if method.readout == "attention-output":
            return torch.stack([gather_rows(a, last) for a in captures]).mean(dim=0)
        if method.readout == "residual":
            return gather_rows(captures[-1], last)
        pooling = method.pooling
        if pooling == "last":
            return gather_rows(hidden, last)
        if pooling == "mean":
            return masked_mean(hidden, mask)
        if pooling == "last-mean":
            return (gather_rows(hidden, last) + masked_mean(hidden, mask)) / 2
        if pooling in ("span", "context-eos") and pool_mask is None:
            raise ValueError(f"method {method.name!r} needs a pool_mask input")
        if pooling == "span":
            return masked_mean(hidden, pool_mask * mask)
        if pooling == "context-eos":  # Causal2Vec: [h(Contextual token); h(EOS)]
            return torch.cat([gather_rows(hidden, pool_mask.argmax(dim=-1)), gather_rows(hidden, last)], dim=-1)
        raise ValueError(f"unknown pooling {pooling!r}")
