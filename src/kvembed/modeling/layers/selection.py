"""Per-layer intrinsic dimension of a decoder's final-token states, and the resulting selection.

What the curve is computed on (the paper, §3.2.3 / Appendix L, only says "1,000 sentences from
F2LLM" and "the final-token hidden state"; these are kvembed's choices):

- Input: every calibration text wrapped in kv-embedding's own *document* prompt
  (``"Context: {text}" Compress the Context in one word:``), with the tokenizer's usual special
  tokens, exactly the token ids ``TorchEmbedder.encode(kind="document")`` feeds the model. The
  layers are chosen to re-route *this* final token's key/value, so the geometry that matters is
  the one of the final token under this prompt. Other prompts are an option (``template``).
- Forward pass: the plain model (no re-routing), batched, right padding, positions counted
  over real tokens; row ``b``'s point is its last real token.
- "Per layer": the output of decoder layer ``l`` for ``l = 0 .. L-1`` (the residual stream
  after the layer), captured by a hook. These are Hugging Face's ``hidden_states[1..L]``,
  except for the last: transformers replaces ``hidden_states[L]`` by the final-normed
  ``last_hidden_state``; we keep the raw output of layer ``L-1`` so that every point of the
  curve measures the same quantity.
- Duplicates: repeated texts are dropped before the forward pass, and near-identical states
  are merged by :func:`~kvembed.modeling.layers.estimate.distinct_points` before TwoNN.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...version import __version__
from ...methods import format_layers, resolve
from ...methods.registry import METHODS
from ...runtime.batching import BatchPolicy, run_batches
from ...runtime.encoding import TextEncoder, check_texts
from .estimate import DISCARD_FRACTION, MIN_POINTS, RULE, select_layers, twonn
from ...errors import InvalidInput

#: kv-embedding's prompts, the default inputs of the ID curve
KV_PROMPTS: Mapping[str, str] = METHODS["kv-embedding"].prompts["compress"]
#: named choices for ``template``: the kv-embedding prompts, or the raw text
PROMPTS: Mapping[str, str] = {"document": KV_PROMPTS["document"], "query": KV_PROMPTS["query"], "raw": "{text}"}

#: ``progress(stage, done, total)``; stages are ``"forward"`` (texts) and ``"twonn"`` (layers)
Progress = Callable[[str, int, int], None]


def calibration_label(calibration: Any) -> str:
    """How a report names the calibration source: ``built-in``, the file path, or ``texts``."""
    if calibration is None:
        return "built-in"
    return str(calibration) if isinstance(calibration, (str, os.PathLike)) else "texts"


def prompt_template(prompt: str) -> str:
    """``"document"``, ``"query"``, ``"raw"`` or a template containing ``{text}`` -> the template."""
    if prompt in PROMPTS:
        return PROMPTS[prompt]
    if "{text}" not in prompt:
        raise InvalidInput(f"prompt must be one of {', '.join(PROMPTS)} or a template containing '{{text}}', got {prompt!r}")
    return prompt


@dataclass(frozen=True)
class LayerSelection:
    """An intrinsic-dimension curve and the re-routing set the ``auto`` rule picks from it."""

    intrinsic_dimension: tuple[float, ...]
    """TwoNN ID after each decoder layer ``0 .. L-1`` (NaN where it could not be estimated)."""
    layers: tuple[int, ...]
    l_star: int
    num_layers: int
    num_texts: int
    template: str
    model: str | None = None
    calibration: str = "built-in"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN becomes ``null``): what ``layers.json`` and manifests record."""
        return {
            "model": self.model,
            "num_layers": self.num_layers,
            "num_texts": self.num_texts,
            "calibration": self.calibration,
            "prompt": self.template,
            "states": "last real token, output of each decoder layer 0..L-1 (pre final norm), no re-routing",
            "estimator": f"TwoNN (Facco et al. 2017), {int(DISCARD_FRACTION * 100)}% largest ratios discarded, duplicates removed",
            "rule": RULE,
            "intrinsic_dimension": [None if not math.isfinite(v) else float(v) for v in self.intrinsic_dimension],
            "l_star": self.l_star,
            "layers": list(self.layers),
            "layers_spec": format_layers(self.layers),
            "kvembed_version": __version__,
        }


def _text_encoder(tokenizer: Any, num_layers: int, template: str, max_length: int) -> TextEncoder:
    from tokenizers import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        backend, hf = tokenizer, None
    else:
        backend, hf = getattr(tokenizer, "backend_tokenizer", None), tokenizer
        if backend is None:
            raise InvalidInput(f"{type(tokenizer).__name__} is not a fast tokenizer; kvembed needs one (tokenizer.json)")
    ids = [getattr(hf, name, None) for name in ("eos_token_id", "bos_token_id", "pad_token_id")] if hf else []
    fallback = next((t for t in ids if t is not None), 0)
    method = resolve("kv-embedding", num_layers, None, layers="none", prompt=template)
    return TextEncoder(Tokenizer.from_str(backend.to_str()), method, max_length, fallback_id=fallback, pad_id=fallback)


def final_token_states(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    template: str = PROMPTS["document"],
    batch_size: int = 32,
    max_length: int = 512,
    progress: Progress | None = None,
) -> np.ndarray:
    """float32 ``(L, n, hidden)``: row ``b``'s last real token after every decoder layer.

    ``model`` is a Hugging Face decoder (base or causal LM); ``tokenizer`` a fast tokenizer.
    """
    import torch

    from ..patch.architectures import base_model

    decoder = base_model(model)
    layers = list(decoder.layers)
    items = check_texts(texts)
    encoder = _text_encoder(tokenizer, len(layers), prompt_template(template), max_length)
    encoded = encoder.encode(items, "document")
    states = np.zeros((len(layers), len(items), decoder.config.hidden_size), dtype=np.float32)
    captured: dict[int, np.ndarray] = {}
    last: dict[str, Any] = {}

    def hook(index: int) -> Callable[..., None]:
        def capture(module: Any, args: Any, output: Any) -> None:
            hidden = output[0] if isinstance(output, tuple) else output
            captured[index] = hidden[torch.arange(hidden.shape[0]), last["index"]].float().cpu().numpy()

        return capture

    def run(batch: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """One padded batch through the plain decoder: each layer's last-real-token rows."""
        captured.clear()
        mask = torch.from_numpy(batch["attention_mask"])
        last["index"] = mask.sum(dim=1) - 1
        decoder(
            input_ids=torch.from_numpy(batch["input_ids"]),
            attention_mask=mask,
            position_ids=(mask.cumsum(dim=-1) - 1).clamp(min=0),
            use_cache=False,
        )
        return [captured[i] for i in range(len(layers))]

    done = 0

    def report(chunk: list[int], batch: Any) -> None:
        nonlocal done
        done += len(chunk)
        if progress is not None:
            progress("forward", done, len(items))

    handles = [layer.register_forward_hook(hook(i)) for i, layer in enumerate(layers)]
    try:
        with torch.inference_mode():
            run_batches(encoded, BatchPolicy(batch_size=batch_size), lambda chunk: encoder.pad(chunk, "right"),
                        run, list(states), on_batch=report)
    finally:
        for handle in handles:
            handle.remove()
    return states


def layer_intrinsic_dimensions(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    template: str = PROMPTS["document"],
    batch_size: int = 32,
    max_length: int = 512,
    progress: Progress | None = None,
) -> np.ndarray:
    """TwoNN ID of the final-token states after each decoder layer: float64 ``(L,)``.

    Repeated texts count once. A layer whose states have fewer than ``MIN_POINTS`` distinct
    points gets NaN (with a warning) and is never selected.
    """
    items = list(dict.fromkeys(check_texts(texts)))
    if len(items) < MIN_POINTS:
        raise InvalidInput(f"need at least {MIN_POINTS} distinct texts for TwoNN, got {len(items)}")
    states = final_token_states(
        model, tokenizer, items, template=template, batch_size=batch_size, max_length=max_length, progress=progress
    )
    ids = np.full(len(states), np.nan)
    for layer, points in enumerate(states):
        try:
            ids[layer] = twonn(points)
        except ValueError as err:
            warnings.warn(f"layer {layer}: intrinsic dimension not estimated ({err})", stacklevel=2)
        if progress is not None:
            progress("twonn", layer + 1, len(states))
    return ids


def select_layers_for_model(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    template: str = PROMPTS["document"],
    batch_size: int = 32,
    max_length: int = 512,
    progress: Progress | None = None,
    model_name: str | None = None,
    calibration: str = "built-in",
) -> LayerSelection:
    """Compute the ID curve on ``texts`` and apply the ``auto`` rule (:func:`select_layers`)."""
    template = prompt_template(template)
    items = list(dict.fromkeys(check_texts(texts)))
    ids = layer_intrinsic_dimensions(
        model, tokenizer, items, template=template, batch_size=batch_size, max_length=max_length, progress=progress
    )
    layers = select_layers(ids, len(ids))
    return LayerSelection(
        intrinsic_dimension=tuple(float(v) for v in ids),
        layers=tuple(layers),
        l_star=layers[0],
        num_layers=len(ids),
        num_texts=len(items),
        template=template,
        model=model_name,
        calibration=calibration,
    )


def compute_layer_selection(
    model: str,
    calibration: Sequence[str] | str | os.PathLike[str] | None = None,
    num_texts: int = 1000,
    *,
    prompt: str = "document",
    batch_size: int = 32,
    max_length: int | None = None,
    progress: Progress | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
    dtype: Any = "float32",
) -> LayerSelection:
    """Load ``model`` (folder, alias, hub id or ``.gguf`` file, as for ``TorchEmbedder``) and
    select its layers; the plain decoder runs, no method patched in.

    ``calibration``: a list of texts, a file with one text per line, or ``None`` for the
    built-in set; its first ``num_texts`` distinct texts are used.
    """
    from ..hf_loading import find_model, input_limit
    from .calibration import load_calibration

    template = prompt_template(prompt)
    found = find_model(model, revision, trust_remote_code)
    texts = load_calibration(calibration, num_texts)
    tokenizer, decoder = found.load(dtype)
    source = calibration_label(calibration)
    return select_layers_for_model(
        decoder,
        tokenizer,
        texts,
        template=template,
        batch_size=batch_size,
        max_length=input_limit(found.config, tokenizer, max_length),
        progress=progress,
        model_name=str(model),
        calibration=source,
    )
