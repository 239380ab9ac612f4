"""TorchEmbedder: every method against an independent plain-torch computation, padding
invariance, method-specific behaviour and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from independent import independent_embed
from kvembed.reference import TorchEmbedder
from conftest import ARCHITECTURES, TEXTS

ALL_METHODS = ("kv-embedding", "va", "aligned-wva", "token-prepending", "last-token", "mean", "prompteol", "echo")
INDEPENDENT_OPTIONS = ("layers", "bias", "num_prefix", "prefix_rope", "pooling", "wva", "tp_start", "tp_stop", "exit_layer")

#: (method, options) variants checked against the independent computation
VARIANTS = [
    ("kv-embedding", {}),
    ("kv-embedding", {"num_prefix": 2, "prefix_rope": "zero", "bias": 0.0}),
    ("kv-embedding", {"layers": "0,2-3", "pooling": "last", "num_prefix": 3, "bias": 2.5}),
    ("kv-embedding", {"layers": "none", "pooling": "mean"}),
    ("va", {}),
    ("va", {"layers": "0,2"}),
    ("aligned-wva", {}),
    ("aligned-wva", {"layers": "1-2", "wva": True, "prompt": "futureeol"}),
    ("token-prepending", {}),
    ("token-prepending", {"tp_start": 0, "tp_stop": 2, "exit_layer": 3, "prompt": "cot"}),
    ("last-token", {}),
    ("mean", {}),
    ("prompteol", {}),
    ("echo", {}),
]

_cache: dict[tuple, TorchEmbedder] = {}


def embedder(path, method: str, **options) -> TorchEmbedder:
    key = (str(path), method, tuple(sorted(options.items())))
    if key not in _cache:
        _cache[key] = TorchEmbedder.from_pretrained(path, method, **options)
    _cache[key].padding_side = "right"
    return _cache[key]


def independent(emb: TorchEmbedder, text: str, kind: str = "document") -> np.ndarray:
    """The independent computation for one text, from the same token ids and the raw weights."""
    item = emb.encoder.encode_one(text, kind)
    ids = list(item.ids)
    kwargs = {k: v for k, v in emb.method.options.items() if k in INDEPENDENT_OPTIONS}
    if emb.method.placeholder:
        kwargs["pst_index"] = ids.index(emb.encoder.placeholder_id)
        ids[kwargs["pst_index"]] = 0
    if item.pool is not None:
        kwargs["pool_range"] = (item.pool[0], item.pool[-1] + 1)
    weights = dict(emb.model.decoder.state_dict())
    return independent_embed(weights, emb.model.decoder.config, emb.method.name, ids, **kwargs)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


# ----- numerical correctness ----------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen3", "stories260k"])
@pytest.mark.parametrize("method,options", VARIANTS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(VARIANTS)])
def test_matches_independent_computation(model_paths, arch, method, options):
    emb = embedder(model_paths[arch], method, **options)
    for kind in ("document", "query"):
        batched = emb.encode(TEXTS, kind=kind, batch_size=4)
        expected = np.stack([independent(emb, text, kind) for text in TEXTS])
        worst = cosines(batched, expected).min()
        assert worst >= 0.99999, f"{method} {options} on {arch} ({kind}): worst cosine {worst}"
        assert np.abs(batched - expected).max() <= 1e-4


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("arch", [*ARCHITECTURES, "stories260k"])
@pytest.mark.parametrize("method", ALL_METHODS)
def test_padding_invariance(model_paths, arch, method, padding_side):
    emb = embedder(model_paths[arch], method)
    alone = np.stack([emb.encode([text])[0] for text in TEXTS])
    emb.padding_side = padding_side
    batched = emb.encode(TEXTS, batch_size=len(TEXTS))
    lengths = {len(emb.encoder.encode_one(t).ids) for t in TEXTS}
    assert len(lengths) > 2, "the batch must mix lengths to exercise padding"
    worst = cosines(alone, batched).min()
    assert worst >= 0.99999, f"{method} on {arch}, {padding_side} padding: worst cosine {worst}"


def test_output_is_unit_float32_in_input_order(model_paths):
    emb = embedder(model_paths["stories260k"], "kv-embedding")
    out = emb.encode(TEXTS, batch_size=2)
    assert out.dtype == np.float32 and out.shape == (len(TEXTS), emb.dim)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    reversed_out = emb.encode(TEXTS[::-1], batch_size=3)
    np.testing.assert_allclose(reversed_out[::-1], out, atol=1e-5)
    raw = emb.encode(TEXTS, normalize=False)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), out, atol=1e-5)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)


def test_query_and_document_prompts_differ(model_paths):
    emb = embedder(model_paths["stories260k"], "kv-embedding")
    query, document = emb.encode_query(TEXTS[:2]), emb.encode_document(TEXTS[:2])
    assert np.abs(query - document).max() > 1e-3
    np.testing.assert_allclose(document, emb.encode(TEXTS[:2]), atol=1e-6)


# ----- kv-embedding -------------------------------------------------------------------------


def test_kv_bias_changes_the_embedding(model_paths):
    zero = embedder(model_paths["stories260k"], "kv-embedding", bias=0.0).encode(TEXTS)
    one = embedder(model_paths["stories260k"], "kv-embedding", bias=1.0).encode(TEXTS)
    assert np.abs(zero - one).max() > 1e-3


@pytest.mark.parametrize("arch", ["qwen3", "stories260k"])
def test_kv_layers_none_is_the_prompt_only_ablation(model_paths, arch):
    """layers=none must equal the unpatched model run on the same prompts, pooled the same way."""
    from transformers import AutoModel, AutoTokenizer

    emb = embedder(model_paths[arch], "kv-embedding", layers="none")
    ours = emb.encode(TEXTS)
    plain = AutoModel.from_pretrained(model_paths[arch]).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_paths[arch])
    template = emb.method.templates["document"]
    expected = []
    with torch.no_grad():
        for text in TEXTS:
            ids = tokenizer(template.replace("{text}", text), return_tensors="pt")["input_ids"]
            hidden = plain(input_ids=ids).last_hidden_state[0]
            vector = (hidden[-1] + hidden.mean(0)) / 2
            expected.append((vector / vector.norm()).numpy())
    assert cosines(ours, np.stack(expected)).min() >= 0.99999
    rerouted = embedder(model_paths[arch], "kv-embedding").encode(TEXTS)
    assert np.abs(rerouted - ours).max() > 1e-3, "re-routing must change the embedding"


def _attention_io(emb: TorchEmbedder, text: str) -> dict[int, tuple[dict, torch.Tensor]]:
    """Per layer: the attention module's keyword inputs and its output, captured in a patched run."""
    seen: dict[int, tuple[dict, torch.Tensor]] = {}
    handles = []
    for index, layer in enumerate(emb.model.decoder.layers):

        def hook(module, args, kwargs, output, index=index):
            seen[index] = ({k: v for k, v in kwargs.items() if k != "kvembed_prefix"}, output[0].detach().clone())

        handles.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
    try:
        emb.encode([text])
    finally:
        for handle in handles:
            handle.remove()
    return seen


def test_kv_layers_outside_the_set_are_untouched(model_paths):
    emb = embedder(model_paths["qwen3"], "kv-embedding", layers="1,3")
    seen = _attention_io(emb, TEXTS[0])
    assert sorted(seen) == [0, 1, 2, 3]
    config = emb.model.decoder.config
    assert config._attn_implementation != "kvembed", "the patch must be restored after encode"
    with torch.no_grad():
        for index, (kwargs, output) in seen.items():
            plain = emb.model.decoder.layers[index].self_attn(**kwargs)[0]
            if index in (1, 3):
                assert (plain - output).abs().max() > 1e-4, f"layer {index} is in R and must be re-routed"
            else:
                torch.testing.assert_close(plain, output, atol=1e-6, rtol=1e-5)


def test_kv_num_prefix_and_prefix_rope_change_the_result(model_paths):
    path = model_paths["stories260k"]
    base = embedder(path, "kv-embedding").encode(TEXTS)
    two = embedder(path, "kv-embedding", num_prefix=2).encode(TEXTS)
    zero = embedder(path, "kv-embedding", prefix_rope="zero").encode(TEXTS)
    assert np.abs(base - two).max() > 1e-3
    assert np.abs(base - zero).max() > 1e-3


def test_kv_num_prefix_longer_than_the_text(model_paths):
    """A prefix longer than the text uses the tokens there are (no padding keys), padding-invariantly."""
    emb = embedder(model_paths["stories260k"], "kv-embedding", num_prefix=200, prompt="{text}")
    texts = ["a", "hello there"]
    alone = np.stack([emb.encode([t])[0] for t in texts])
    expected = np.stack([independent(emb, t) for t in texts])
    for side in ("right", "left"):
        emb.padding_side = side
        assert cosines(emb.encode(texts), expected).min() >= 0.99999
    assert cosines(alone, expected).min() >= 0.99999


# ----- va / aligned-wva ---------------------------------------------------------------------


def _forbid_layers_from(emb: TorchEmbedder, first: int):
    def boom(module, args):
        raise AssertionError(f"layer {module.kvembed_test_index} ran but should have been cut off")

    handles = []
    for index, layer in enumerate(emb.model.decoder.layers):
        if index >= first:
            layer.kvembed_test_index = index
            handles.append(layer.register_forward_pre_hook(boom))
    return handles


@pytest.mark.parametrize("method", ["va", "aligned-wva", "token-prepending"])
def test_early_exit_never_runs_later_layers(model_paths, method):
    options = {"token-prepending": {"exit_layer": 2, "tp_stop": 2}}.get(method, {"layers": "0-1"})
    emb = embedder(model_paths["llama"], method, **options)
    handles = _forbid_layers_from(emb, 2)
    try:
        out = emb.encode(TEXTS)
    finally:
        for handle in handles:
            handle.remove()
    assert np.isfinite(out).all()
    assert len(emb.model.decoder.layers) == 4, "the full layer list must be restored"


def test_value_width_is_before_the_gqa_repeat(model_paths):
    from transformers import AutoConfig

    for name in ("stories260k", "qwen3"):
        config = AutoConfig.from_pretrained(model_paths[name])
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        emb = embedder(model_paths[name], "va")
        assert config.num_key_value_heads < config.num_attention_heads
        assert emb.encode(TEXTS[:2]).shape == (2, config.num_key_value_heads * head_dim)
        wva = embedder(model_paths[name], "aligned-wva", wva=True)
        assert wva.dim == config.num_attention_heads * head_dim
        assert embedder(model_paths[name], "aligned-wva").dim == config.hidden_size


# ----- token-prepending ---------------------------------------------------------------------


def test_placeholder_sits_before_the_quoted_text(model_paths):
    from transformers import AutoTokenizer

    emb = embedder(model_paths["stories260k"], "token-prepending")
    tokenizer = AutoTokenizer.from_pretrained(model_paths["stories260k"])
    ids = emb.encoder.encode_one("A man is playing a guitar.").ids
    position = ids.index(emb.encoder.placeholder_id)
    assert position == len(tokenizer("This sentence :")["input_ids"])  # the space before <PST> is absorbed
    assert ids.count(emb.encoder.placeholder_id) == 1
    assert emb.encoder.placeholder_id >= tokenizer.vocab_size  # a new id, never a real token


def test_placeholder_ids_match_the_official_code(llama2_tokenizer_path):
    """METHODS.md: the official code's ids with Llama 2's fast tokenizer."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from kvembed.methods import resolve
    from kvembed.runtime.encoding import TextEncoder

    hf = AutoTokenizer.from_pretrained(llama2_tokenizer_path)
    encoder = TextEncoder(Tokenizer.from_str(hf.backend_tokenizer.to_str()), resolve("token-prepending", 32), 4096)
    pst = encoder.placeholder_id
    expected = [1, 910, 10541, 584, pst, 376, 29909, 767, 338, 8743, 263, 11210, 1213, 2794, 297, 697, 1734, 6160]
    assert list(encoder.encode_one("A man is playing a guitar.").ids) == expected


def test_token_prepending_window_matters(model_paths):
    path = model_paths["llama"]
    default = embedder(path, "token-prepending").encode(TEXTS)
    empty_window = embedder(path, "token-prepending", tp_start=1, tp_stop=1).encode(TEXTS)
    wide = embedder(path, "token-prepending", tp_start=0, tp_stop=3).encode(TEXTS)
    assert np.abs(default - empty_window).max() > 1e-3
    assert np.abs(default - wide).max() > 1e-3
    expected = np.stack([independent(embedder(path, "token-prepending", tp_start=1, tp_stop=1), t) for t in TEXTS])
    assert cosines(empty_window, expected).min() >= 0.99999


@pytest.mark.parametrize("exit_layer", [1, 2, 4])
def test_token_prepending_exit_layer(model_paths, exit_layer):
    emb = embedder(model_paths["qwen3"], "token-prepending", exit_layer=exit_layer)
    assert emb.method.layers_needed == exit_layer
    expected = np.stack([independent(emb, t) for t in TEXTS])
    assert cosines(emb.encode(TEXTS), expected).min() >= 0.99999


# ----- tokenisation parity with transformers --------------------------------------------------


@pytest.mark.parametrize("method", ["kv-embedding", "mean", "echo", "prompteol"])
def test_token_ids_equal_the_hf_tokenizer(model_paths, method):
    from transformers import AutoTokenizer

    from kvembed.runtime.encoding import preprocess_text

    emb = embedder(model_paths["stories260k"], method)
    tokenizer = AutoTokenizer.from_pretrained(model_paths["stories260k"])
    for text in TEXTS:
        cleaned = preprocess_text(text) if emb.method.preprocess else text
        prompt = emb.method.templates["document"].replace("{text}", cleaned)
        assert list(emb.encoder.encode_one(text).ids) == tokenizer(prompt)["input_ids"]


def test_echo_pools_over_the_second_copy_only(model_paths):
    emb = embedder(model_paths["stories260k"], "echo")
    text = "The cat sat."
    item = emb.encoder.encode_one(text)
    pooled = bytes(item.ids[i] - 3 for i in item.pool).decode()  # byte-level ids: byte b -> id b + 3
    assert pooled.strip() == text
    assert item.pool[-1] == len(item.ids) - 1 and item.pool[0] > len(item.ids) // 2


# ----- bad input ------------------------------------------------------------------------------


def test_empty_list_gives_zero_rows(model_paths):
    emb = embedder(model_paths["stories260k"], "va")
    out = emb.encode([])
    assert out.shape == (0, emb.dim) and out.dtype == np.float32


@pytest.mark.parametrize("method", ALL_METHODS)
@pytest.mark.parametrize("arch", ["qwen3", "stories260k"])
def test_empty_and_whitespace_texts_give_unit_vectors(model_paths, method, arch):
    emb = embedder(model_paths[arch], method)
    out = emb.encode(["", "   ", "\n\t", "x"])
    assert np.isfinite(out).all()
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)


def test_qwen3_raw_empty_text_uses_the_fallback_token(model_paths):
    """The tiny Qwen3 shares the byte tokenizer (adds BOS), so build the no-special-token case by hand."""
    from tokenizers import Tokenizer

    from kvembed.methods import resolve
    from kvembed.runtime.encoding import TextEncoder

    tokenizer = Tokenizer.from_file(str(model_paths["stories260k"] / "tokenizer.json"))
    tokenizer.post_processor = None
    encoder = TextEncoder(tokenizer, resolve("mean", 4), 64, fallback_id=2)
    assert encoder.encode_one("").ids == (2,)


@pytest.mark.parametrize("bad,index", [(["ok", None], 1), ([3, "ok"], 0), (["a", "b", b"c"], 2)])
def test_non_str_items_raise_type_error_naming_the_index(model_paths, bad, index):
    emb = embedder(model_paths["stories260k"], "mean")
    with pytest.raises(TypeError, match=rf"texts\[{index}\]"):
        emb.encode(bad)
    with pytest.raises(TypeError):
        emb.encode(None)


def test_long_text_is_truncated_with_a_warning(model_paths):
    emb = embedder(model_paths["stories260k"], "kv-embedding")
    long_text = "word " * 20_000  # 100k characters
    with pytest.warns(UserWarning, match="truncated"):
        out = emb.encode([long_text, "short"])
    assert np.isfinite(out).all()
    item = emb.encoder.encode_one(long_text)
    assert item.truncated and len(item.ids) <= emb.max_length
    suffix = emb.encoder.encode_one("").ids[-10:]
    assert item.ids[-10:] == suffix, "the prompt's closing instruction must survive truncation"


def test_single_string_gives_a_vector(model_paths):
    emb = embedder(model_paths["stories260k"], "mean")
    assert emb.encode("hello").shape == (emb.dim,)


def test_unknown_method_lists_the_valid_ones(model_paths):
    with pytest.raises(ValueError, match="available methods: kv-embedding, va"):
        TorchEmbedder.from_pretrained(model_paths["stories260k"], "kv-embeddings")


def test_unknown_option_lists_the_valid_ones(model_paths):
    with pytest.raises(ValueError, match="valid options: layers, bias, num_prefix"):
        TorchEmbedder.from_pretrained(model_paths["stories260k"], "kv-embedding", biass=1.0)


def test_layer_out_of_range_names_the_range(model_paths):
    with pytest.raises(ValueError, match=r"valid indices are 0\.\.4"):
        TorchEmbedder.from_pretrained(model_paths["stories260k"], "va", layers="3-7")


def test_unsupported_architecture_lists_the_supported_ones(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=2, n_embd=32, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="supports llama, mistral, qwen2, qwen3"):
        TorchEmbedder.from_pretrained(tmp_path, "mean")


def test_missing_model_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model folder"):
        TorchEmbedder.from_pretrained(tmp_path / "nope", "mean")


def test_wrong_kind(model_paths):
    with pytest.raises(ValueError, match="kind must be one of query, document"):
        embedder(model_paths["stories260k"], "mean").encode(["x"], kind="passage")
