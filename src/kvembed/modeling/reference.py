"""``TorchEmbedder``: the PyTorch reference every export and runtime is measured against."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoTokenizer

from ..status import waiting
from ..methods import ResolvedMethod, get_method, resolve
from ..methods.layers import AUTO
from ..methods.sentence_transformers import folder_method
from ..methods.sharing import AlsoRequest, output_label, resolve_also
from ..runtime.batching import BatchPolicy, run_batches
from ..runtime.encoding import EncodedText, TextEncoder, check_texts
from .hf_loading import find_model, input_limit, model_max_length, stored_dtype
from .patch import EmbeddingModel, architecture_of
from ..errors import InvalidInput


class TorchEmbedder:
    """Embeds texts with a patched Hugging Face model, one method at a time.

    Build it with `from_pretrained`. ``encode`` returns float32 rows in input order.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        method: ResolvedMethod,
        max_length: int,
        padding_side: str = "right",
        source: str | None = None,
        also: Mapping[str, ResolvedMethod] | None = None,
        context: "ContextParts | None" = None,
    ) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise InvalidInput(
                f"{type(tokenizer).__name__} is not a fast tokenizer; kvembed needs one (tokenizer.json)"
            )
        fallback = next(
            (t for t in (tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id) if t is not None), 0
        )
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else fallback
        self.hf_tokenizer = tokenizer
        self.tokenizer: Tokenizer = Tokenizer.from_str(backend.to_str())
        self.context = context
        self.encoder = TextEncoder(
            self.tokenizer, method, max_length, fallback_id=fallback, pad_id=pad,
            **({} if context is None else context.encoder_kwargs()),
        )
        self.model = EmbeddingModel(
            model, method, self.encoder.placeholder_id, also, None if context is None else context.module
        ).eval()
        self.method = method
        self.max_length = max_length
        self.padding_side = padding_side
        self.source = source
        #: the intrinsic-dimension curve and chosen set when built with layers="auto", else None
        self.layer_selection: dict[str, Any] | None = None
        #: what from_pretrained resolved ``source`` to (folder or hub id), its preset and revision
        self.location: str | None = None
        self.preset_id: str | None = None
        self.revision: str | None = None
        #: the GGUF file this model was dequantized from (file, sha256, quantization, ...), else None
        self.gguf: dict[str, Any] | None = None
        #: Causal2Vec: what the checkpoint holds (encoder, projector sha256, adapter), else None
        self.causal2vec: dict[str, Any] | None = None
        #: the dtype the source checkpoint's weights are stored in (e.g. "bfloat16"), if known
        self.source_dtype: str | None = None

    @classmethod
    def from_pretrained(
        cls,
        model: str | os.PathLike[str],
        method: str = "kv-embedding",
        *,
        max_length: int | None = None,
        padding_side: str = "right",
        dtype: torch.dtype | str = torch.float32,
        revision: str | None = None,
        trust_remote_code: bool = False,
        calibration: Sequence[str] | str | os.PathLike[str] | None = None,
        num_calibration_texts: int = 1000,
        also: Sequence[str | AlsoRequest] = (),
        **options: Any,
    ) -> "TorchEmbedder":
        """Load ``model`` (local folder, alias such as ``qwen3-4b``/``stories260k``, or hub id).

        ``options`` are the method's options (``layers``, ``bias``, ...); unknown ones raise
        ValueError naming the valid ones. The architecture is checked before weights load.

        ``layers="auto"`` (kv-embedding) picks the re-routing set by intrinsic dimension
        (`kvembed.modeling.layers`): the first ``num_calibration_texts`` texts of ``calibration`` (a
        list of texts, a file with one per line, or ``None`` for the built-in set) go through the
        plain model once, at load time; nothing is cached. The curve and the set are kept in
        ``embedder.layer_selection`` (a JSON-ready dict; ``None`` without ``auto``).

        ``also`` adds other methods read from the same forward pass (``"va"``,
        ``"va:layers=8-12"``, ``"last=kv-embedding:pooling=last"``; see
        `kvembed.methods.sharing`); ``encode(..., output=label)`` returns theirs.
        """
        if get_method(method).contextual:  # a Causal2Vec checkpoint folder, not a bare model
            if also:
                raise InvalidInput("causal2vec cannot take --also: its Contextual token makes its forward pass its own")
            return cls._from_causal2vec(model, method, max_length=max_length, padding_side=padding_side, dtype=dtype, **options)
        if get_method(method).name == "st":  # a trained embedder's folder: its pooling and prompts
            from .sources import sentence_transformers_folder

            model, options = folder_method(sentence_transformers_folder(model, revision), options)
        found = find_model(model, revision, trust_remote_code)
        config, preset_id, text = found.config, found.preset_id, found.text
        auto = _is_auto(options.get("layers")) and get_method(method).name == "kv-embedding"
        if not auto and calibration is not None:
            raise InvalidInput("calibration is only used with layers='auto' (kv-embedding)")
        if auto:  # a missing or too short calibration set fails before the weights load
            from .layers.calibration import load_calibration

            calibration_texts = load_calibration(calibration, num_calibration_texts)
        # with auto, check every other option now (cheaply); the layer set comes after loading
        resolved = resolve(method, config.num_hidden_layers, preset_id, **{**options, **({"layers": "none"} if auto else {})})
        if not auto:  # refuse an extra output that cannot share the pass before loading weights
            resolve_also(resolved, list(also), preset_id)
        tokenizer, hf_model = found.load(dtype)
        limit = input_limit(config, tokenizer, max_length)
        selection = None
        if auto:
            from .layers.selection import calibration_label, select_layers_for_model

            with waiting(f"choosing the layers of {text} by intrinsic dimension ({len(calibration_texts)} calibration texts)"):
                selection = select_layers_for_model(
                    hf_model,
                    tokenizer,
                    calibration_texts,
                    template=resolved.templates["document"],
                    max_length=limit,
                    model_name=text,
                    calibration=calibration_label(calibration),
                )
            resolved = resolve(method, config.num_hidden_layers, preset_id, **{**options, "layers": list(selection.layers)})
        extra = resolve_also(resolved, list(also), preset_id)
        embedder = cls(hf_model, tokenizer, resolved, limit, padding_side=padding_side, source=text, also=extra)
        embedder.layer_selection = None if selection is None else selection.to_dict()
        embedder.location, embedder.preset_id, embedder.revision = found.location, preset_id, revision
        embedder.gguf = None if found.gguf is None else found.gguf.to_dict()
        embedder.source_dtype = found.stored_dtype
        return embedder

    @classmethod
    def _from_causal2vec(
        cls, path: str | os.PathLike[str], method: str, *, max_length: int | None, padding_side: str,
        dtype: torch.dtype | str, **options: Any,
    ) -> "TorchEmbedder":
        """Load a Causal2Vec checkpoint (`kvembed.modeling.causal2vec`): its LLM (adapter merged),
        encoder, projector and prompts; ``options`` override the checkpoint's ``causal2vec.json``."""
        import hashlib

        from .causal2vec import Causal2VecCheckpoint
        from .patch.contextual import load_context_encoder, load_llm

        checkpoint = Causal2VecCheckpoint.read(path)
        config = AutoConfig.from_pretrained(str(checkpoint.llm))
        architecture_of(config)
        resolved = resolve(method, config.num_hidden_layers, None, **{**checkpoint.method_options(), **options})
        tokenizer = AutoTokenizer.from_pretrained(str(checkpoint.llm))
        limit = input_limit(config, tokenizer, max_length)
        encoder_tokenizer = AutoTokenizer.from_pretrained(str(checkpoint.encoder))
        encoder_config = AutoConfig.from_pretrained(str(checkpoint.encoder))
        context = ContextParts(
            module=load_context_encoder(checkpoint, _dtype(dtype)),
            tokenizer=Tokenizer.from_file(str(checkpoint.encoder / "tokenizer.json")),
            max_length=min(checkpoint.encoder_max_length, model_max_length(encoder_config, encoder_tokenizer)),
            pad_id=int(encoder_tokenizer.pad_token_id or 0),
        )
        hf_model = load_llm(checkpoint, _dtype(dtype))
        embedder = cls(hf_model, tokenizer, resolved, limit, padding_side=padding_side, source=str(path), context=context)
        embedder.location = str(checkpoint.root.resolve())
        embedder.source_dtype = stored_dtype(checkpoint.llm, config)
        embedder.causal2vec = {
            "encoder_model_type": encoder_config.model_type,
            "encoder_hidden_size": checkpoint.encoder_hidden,
            "encoder_max_length": context.max_length,
            "projector_sha256": hashlib.sha256(checkpoint.projector.read_bytes()).hexdigest(),
            "adapter_merged": checkpoint.adapter is not None,
        }
        return embedder

    @property
    def dim(self) -> int:
        return self.model.output_dim

    @property
    def also(self) -> dict[str, ResolvedMethod]:
        """Extra methods read from the same forward pass: label -> method."""
        return dict(self.model.also)

    def _label(self, output: str | None) -> str | None:
        return output_label(output, self.method.name, list(self.model.also))

    def _method_of(self, label: str | None) -> ResolvedMethod:
        return self.method if label is None else self.model.also[label]

    def dim_of(self, output: str | None = None) -> int:
        return self.model.readout_dim(self._method_of(self._label(output)))

    def single(self, output: str | None = None) -> "TorchEmbedder":
        """A reference computing only ``output``'s method, in a pass of its own (shares weights)."""
        embedder = type(self)(
            self.model.decoder, self.hf_tokenizer, self._method_of(self._label(output)), self.max_length,
            padding_side=self.padding_side, source=self.source, context=self.context,
        )
        embedder.location, embedder.preset_id, embedder.revision = self.location, self.preset_id, self.revision
        embedder.gguf, embedder.causal2vec, embedder.source_dtype = self.gguf, self.causal2vec, self.source_dtype
        return embedder

    def references(self) -> dict[str | None, "TorchEmbedder"]:
        """A single-method reference per output (None: the main one), each in a pass of its own:
        what the parity gate checks every output of an ``also`` graph against."""
        if not self.model.also:
            return {None: self}
        return {label: self.single(label) for label in [None, *self.model.also]}

    def encode(
        self,
        texts: Sequence[str] | str,
        kind: str = "document",
        batch_size: int = 32,
        normalize: bool = True,
        output: str | None = None,
    ) -> np.ndarray:
        """Embed ``texts`` as ``kind`` (``"query"`` or ``"document"``): float32 (n, dim).

        A single str gives a 1-D vector. Texts longer than ``max_length`` tokens are cut (the
        prompt template stays whole) with a warning. ``output`` names an ``also`` method.
        """
        label = self._label(output)
        method = self._method_of(label)
        index = 0 if label is None else 1 + list(self.model.also).index(label)
        single = isinstance(texts, str)
        items = check_texts([texts] if single else texts)
        encoded = self.encoder.encode(items, kind)
        out = np.zeros((len(items), self.model.readout_dim(method)), dtype=np.float32)
        with torch.inference_mode(), self.model.patched():
            run_batches(encoded, BatchPolicy(batch_size=batch_size), self._pad,
                        lambda batch: [self._run(batch, normalize, index)], [out])
        return out[0] if single else out

    def encode_query(self, texts: Sequence[str] | str, **kwargs: Any) -> np.ndarray:
        return self.encode(texts, kind="query", **kwargs)

    def encode_document(self, texts: Sequence[str] | str, **kwargs: Any) -> np.ndarray:
        return self.encode(texts, kind="document", **kwargs)

    def _pad(self, items: Sequence[EncodedText]) -> dict[str, np.ndarray]:
        """The loop's pad step: the encoder's, on this reference's ``padding_side``."""
        return self.encoder.pad(items, self.padding_side)

    def _run(self, batch: Mapping[str, np.ndarray], normalize: bool, index: int = 0) -> np.ndarray:
        """The loop's run step: one padded batch through the patched model, output ``index``."""
        tensors = {k: torch.from_numpy(v) for k, v in batch.items()}
        embedding, pooled = self.model(**tensors)[2 * index : 2 * index + 2]
        return (embedding if normalize else pooled).float().numpy()


@dataclass(frozen=True)
class ContextParts:
    """Causal2Vec's context side: the encoder + projector module and the encoder's tokenizer."""

    module: torch.nn.Module
    tokenizer: Tokenizer
    max_length: int
    pad_id: int

    def encoder_kwargs(self) -> dict[str, Any]:
        """The `TextEncoder` arguments for this context encoder (a copy of the tokenizer:
        the encoder sets truncation on it)."""
        return {
            "context_tokenizer": Tokenizer.from_str(self.tokenizer.to_str()),
            "context_max_length": self.max_length,
            "context_pad_id": self.pad_id,
        }


def _dtype(dtype: torch.dtype | str) -> torch.dtype:
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def _is_auto(layers: Any) -> bool:
    return isinstance(layers, str) and layers.strip().lower() == AUTO
