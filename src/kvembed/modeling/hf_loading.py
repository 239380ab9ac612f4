"""Loading a Hugging Face decoder for kvembed: find it, read its config, then its weights, quietly.

One place for what the reference embedder (:mod:`kvembed.modeling.reference`) and layer selection
(:mod:`kvembed.modeling.layers`) both need, so that neither imports the other. The config is read on its
own first: callers refuse an unsupported architecture or bad options before any weights load.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer

from ..status import waiting
from ..methods.architectures import architecture_of
from .quiet import quiet_transformers
from .sources import locate_model
from ..errors import InvalidInput

#: tokenizers report "no limit" as a huge number; anything above this is not a real bound
_UNBOUNDED = 10**8


@dataclass(frozen=True)
class FoundModel:
    """A model located and its config read (architecture checked); weights not loaded yet."""

    text: str
    """What the caller named (folder, alias, hub id or ``.gguf`` file)."""
    location: str
    """The Hugging Face folder or hub id the weights load from (a GGUF file's dequantized cache)."""
    preset_id: str | None
    gguf: Any
    """The GGUF source (:class:`kvembed.modeling.sources.GGUFSource`) when the model is a ``.gguf`` file."""
    config: Any
    revision: str | None = None
    trust_remote_code: bool = False

    def load(self, dtype: torch.dtype | str = torch.float32) -> tuple[Any, Any]:
        """The tokenizer and the bare decoder (``AutoModel``, no LM head), in eval mode.

        A 16-bit checkpoint asked for in float32 loads in its own dtype and is then cast in place
        (:func:`upcast`): the same values as transformers' cast while loading, without the stored
        shards mapped beside the whole float32 model at the end of the load."""
        tokenizer = AutoTokenizer.from_pretrained(
            self.location, revision=self.revision, trust_remote_code=self.trust_remote_code
        )
        wanted = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        stored = getattr(torch, self.stored_dtype, None) if self.stored_dtype else None
        load_as = stored if wanted == torch.float32 and stored in (torch.bfloat16, torch.float16) else wanted
        with quiet_transformers(), waiting(f"loading the weights of {self.text}"):  # an unused lm_head is not news
            model = AutoModel.from_pretrained(
                self.location, dtype=load_as, revision=self.revision, trust_remote_code=self.trust_remote_code
            )
        if load_as != wanted:
            upcast(model, wanted)
        return tokenizer, model.eval()

    @functools.cached_property
    def stored_dtype(self) -> str | None:
        """:func:`stored_dtype` of this model's weights."""
        return stored_dtype(self.location, self.config)


def upcast(model: Any, dtype: torch.dtype) -> None:
    """Cast ``model``'s floating parameters and buffers to ``dtype`` one tensor at a time (each
    16-bit tensor is freed as its copy is made), and say so in its config as a direct load would."""
    model.to(dtype)
    model.config.dtype = dtype


#: safetensors header dtypes -> torch's names
_SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64",
                       "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


@contextlib.contextmanager
def readable_weights(file: Path):
    """A damaged weights file (safetensors' own error) as one line naming it: the user's file, not a kvembed bug."""
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as err:
        detail = " ".join(str(err).split())[:200]
        raise InvalidInput(f"{str(file)!r} is not a readable safetensors file ({detail}); is it complete?") from None


def stored_dtype(location: str | os.PathLike[str], config: Any = None) -> str | None:
    """The floating dtype a checkpoint's weights are stored in (most elements), read from the
    safetensors headers of a local folder (every shard), else what ``config`` declares; None if
    neither says. The export runs in float32 whatever this is; the manifest records it."""
    folder = Path(location)
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if files:
        from safetensors import safe_open

        counts: dict[str, int] = {}
        for file in files:
            with readable_weights(file), safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():
                    part = handle.get_slice(key)
                    name = _SAFETENSORS_DTYPES.get(part.get_dtype())
                    if name is not None:
                        counts[name] = counts.get(name, 0) + int(torch.Size(part.get_shape()).numel())
        if counts:
            return max(counts, key=counts.__getitem__)
    declared = getattr(config, "dtype", None) if config is not None else None
    return None if declared is None else str(declared).removeprefix("torch.")


def find_model(
    model: str | os.PathLike[str], revision: str | None = None, trust_remote_code: bool = False
) -> FoundModel:
    """Locate ``model`` and read its config; an unsupported architecture raises here."""
    source = locate_model(model, revision)  # fails within seconds when nothing is there
    location = source.location
    if source.gguf is not None:  # dequantized once into a cached Hugging Face folder
        from .gguf import materialize

        location = str(materialize(Path(source.location), source.gguf))
    try:
        config = AutoConfig.from_pretrained(location, revision=revision, trust_remote_code=trust_remote_code)
    except OSError as err:
        raise FileNotFoundError(
            f"cannot load a model config from {str(model)!r}: not a local model folder, and the hub is "
            f"unreachable or has no such model ({err.__class__.__name__})"
        ) from err
    architecture_of(config)
    return FoundModel(str(model), location, source.preset_id, source.gguf, config, revision, trust_remote_code)


def model_max_length(config: Any, tokenizer: Any) -> int:
    """The longest input both the model's positions and the tokenizer's declared limit allow."""
    limits = [getattr(config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)]
    usable = [int(x) for x in limits if x is not None and 0 < int(x) < _UNBOUNDED]
    return min(usable) if usable else 2048


def input_limit(config: Any, tokenizer: Any, max_length: int | None) -> int:
    """:func:`model_max_length`, lowered to the caller's ``max_length`` (which must be >= 1)."""
    limit = model_max_length(config, tokenizer)
    if max_length is None:
        return limit
    if int(max_length) < 1:
        raise InvalidInput(f"max_length must be >= 1, got {max_length}")
    return min(limit, int(max_length))
