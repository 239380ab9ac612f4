"""TorchEmbedder: every method against the independent oracle (tests/independent.py, which reads
each model folder and tokenizes by itself), padding invariance, method-specific behaviour,
threads and bad input."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

import independent
from checks import assert_matches_oracle, assert_same, run_python
from conftest import ARCHITECTURES, MISTRAL_WINDOW, TEXTS
from kvembed.modeling.reference import TorchEmbedder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ALL_METHODS = ("kv-embedding", "va", "aligned-wva", "token-prepending", "last-token", "mean", "prompteol", "echo")

#: (method, options) variants checked against the oracle; the same options go to both sides
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
    ("token-prepending", {"tp_stop": 2, "prompt": "ke"}),
    ("last-token", {}),
    ("mean", {}),
    ("prompteol", {}),
    ("echo", {}),
]

#: kv-embedding's default re-routing set where it is not the oracle's depth band: the demo
#: model's preset (kvembed.methods.models.PRESETS["stories260k"]), pinned here literally
KV_DEFAULT_LAYERS = {"stories260k": "1-3"}

_cache: dict[tuple, TorchEmbedder] = {}


def embedder(path, method: str, **options) -> TorchEmbedder:
    key = (str(path), method, tuple(sorted(options.items())))
    if key not in _cache:
        _cache[key] = TorchEmbedder.from_pretrained(path, method, **options)
    _cache[key].padding_side = "right"
    return _cache[key]


def oracle_options(arch: str, method: str, options: dict) -> dict:
    """The options the oracle gets: the test's own, plus kv-embedding's preset where one applies."""
    if method == "kv-embedding" and "layers" not in options and arch in KV_DEFAULT_LAYERS:
        return {**options, "layers": KV_DEFAULT_LAYERS[arch]}
    return dict(options)


# ----- numerical correctness ----------------------------------------------------------------


@pytest.mark.parametrize("arch", [*ARCHITECTURES, "stories260k"])
@pytest.mark.parametrize("method,options", VARIANTS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(VARIANTS)])
def test_matches_independent_computation(model_paths, oracle, arch, method, options):
    """Batched, right-padded kvembed vs the oracle one text at a time, as documents and queries:
    cosine >= 0.99999 and max abs <= 1e-4 (METHODS.md). The tiny Mistral's prompts are longer
    than its sliding window; Qwen2's q/k/v biases and every model's norm weights are random."""
    emb = embedder(model_paths[arch], method, **options)
    encode = lambda texts, kind: emb.encode(texts, kind=kind, batch_size=4)  # noqa: E731
    assert_matches_oracle(encode, oracle(arch), method, TEXTS, what=arch, **oracle_options(arch, method, options))


def test_the_oracle_refuses_options_it_does_not_know(oracle):
    """A renamed option fails the comparison instead of silently taking the oracle's default."""
    with pytest.raises(TypeError, match="takes no option logit_bias"):
        oracle("stories260k").embed("kv-embedding", "x", logit_bias=1.0)
    with pytest.raises(TypeError, match="takes no option layers"):
        oracle("stories260k").embed("token-prepending", "x", layers="1")


def test_the_tiny_models_exercise_biases_norms_and_the_sliding_window(model_paths, oracle):
    """What the comparison above relies on: non-trivial biases and norm weights in the saved
    checkpoints, and Mistral prompts longer than its window (where the window changes the result)."""
    qwen2 = oracle("qwen2")
    assert qwen2.weights["layers.0.self_attn.q_proj.bias"].abs().max() > 0.01
    assert oracle("granite").weights["layers.0.mlp.down_proj.bias"].abs().max() > 0.01
    stablelm = oracle("stablelm")  # LayerNorm biases and q/k/v biases, a quarter of each head rotated
    assert all(stablelm.weights[f"layers.0.{name}.bias"].abs().max() > 0.01
               for name in ("input_layernorm", "post_attention_layernorm", "self_attn.k_proj"))
    assert stablelm.weights["norm.bias"].abs().max() > 0.01 and stablelm.hp.rotary_dim == stablelm.hp.head_dim // 4
    for arch in ARCHITECTURES:
        norms = {name: t for name, t in oracle(arch).weights.items() if name.startswith("layers.0.") and name.endswith("norm.weight")}
        assert len(norms) >= (1 if arch == "cohere" else 2) and all((t - 1).abs().max() > 0.1 for t in norms.values()), arch
    olmo2 = oracle("olmo2")  # its q/k norms span every head at once
    assert olmo2.weights["layers.0.self_attn.q_norm.weight"].numel() == olmo2.hp.n_heads * olmo2.hp.head_dim
    assert "layers.0.input_layernorm.weight" not in olmo2.weights
    cohere = oracle("cohere")  # one bias-free LayerNorm feeds attention and MLP; its attention biases are on
    assert {"layers.0.post_attention_layernorm.weight", "layers.0.input_layernorm.bias"}.isdisjoint(cohere.weights)
    assert cohere.weights["layers.0.self_attn.o_proj.bias"].abs().max() > 0.01
    mistral = oracle("mistral")
    assert mistral.hp.sliding_window == MISTRAL_WINDOW
    tokens = mistral.tokenize("mean", TEXTS[2])
    assert len(tokens.ids) > 2 * MISTRAL_WINDOW
    windowed = mistral.embed_tokens("mean", tokens)
    mistral.hp.sliding_window = None
    try:
        full = mistral.embed_tokens("mean", tokens)
    finally:
        mistral.hp.sliding_window = MISTRAL_WINDOW
    assert np.abs(windowed - full).max() > 1e-3, "the window must matter for this text"
    gemma2 = oracle("gemma2")  # the soft cap bounds scores the random weights reach
    assert gemma2.hp.layer_types[:2] == ["sliding_attention", "full_attention"] and gemma2.hp.sliding_window == MISTRAL_WINDOW
    capped = gemma2.embed_tokens("mean", gemma2.tokenize("mean", TEXTS[2]))
    cap, gemma2.hp.softcap = gemma2.hp.softcap, None
    try:
        uncapped = gemma2.embed_tokens("mean", gemma2.tokenize("mean", TEXTS[2]))
    finally:
        gemma2.hp.softcap = cap
    assert cap == 1.0 and 1 - float(capped @ uncapped) > 1e-4, "the cap must matter for this text"


@pytest.mark.parametrize("arch", [*ARCHITECTURES, "stories260k"])
def test_weights_are_the_checkpoint_s(model_paths, oracle, arch):
    """Every decoder parameter kvembed runs equals the checkpoint's tensor of the same name, and
    none is missing from the checkpoint: silently re-initialised weights fail here."""
    emb = embedder(model_paths[arch], "mean")
    stored = oracle(arch).weights
    state = emb.model.decoder.state_dict()
    assert set(state) == set(stored), sorted(set(state) ^ set(stored))
    for name, tensor in state.items():
        assert torch.equal(tensor, stored[name].to(tensor.dtype)), name


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
    assert_same(batched, alone, what=f"{method} on {arch}, {padding_side} padding")


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
    """layers=none must equal the unpatched transformers model run on METHODS.md's prompt, pooled
    the same way."""
    from transformers import AutoModel, AutoTokenizer

    emb = embedder(model_paths[arch], "kv-embedding", layers="none")
    ours = emb.encode(TEXTS)
    plain = AutoModel.from_pretrained(model_paths[arch]).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_paths[arch])
    template = independent.KV_PROMPTS["document"]
    expected = []
    with torch.no_grad():
        for text in TEXTS:
            ids = tokenizer(template.replace("{text}", text), return_tensors="pt")["input_ids"]
            hidden = plain(input_ids=ids).last_hidden_state[0]
            vector = (hidden[-1] + hidden.mean(0)) / 2
            expected.append((vector / vector.norm()).numpy())
    assert_same(ours, np.stack(expected))
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


def test_kv_num_prefix_longer_than_the_text(model_paths, oracle):
    """A prefix longer than the text uses the tokens there are (no padding keys), padding-invariantly."""
    emb = embedder(model_paths["stories260k"], "kv-embedding", num_prefix=200, prompt="{text}")
    texts = ["a", "hello there"]
    alone = np.stack([emb.encode([t])[0] for t in texts])
    expected = np.stack([oracle("stories260k").embed("kv-embedding", t, num_prefix=200, prompt="{text}", layers="1-3")
                         for t in texts])
    for side in ("right", "left"):
        emb.padding_side = side
        assert_same(emb.encode(texts), expected, what=f"{side} padding")
    assert_same(alone, expected)


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
    """The space before <PST> is absorbed (METHODS.md: "▁:", "<PST>", '▁"'); the one after starts the quote."""
    from transformers import AutoTokenizer

    emb = embedder(model_paths["stories260k"], "token-prepending")
    tokenizer = AutoTokenizer.from_pretrained(model_paths["stories260k"])
    ids = emb.encoder.encode_one("A man is playing a guitar.").ids
    position = ids.index(emb.encoder.placeholder_id)
    assert list(ids[:position]) == tokenizer("This sentence :")["input_ids"]
    assert list(ids[position + 1 :]) == tokenizer(' "A man is playing a guitar." means in one word:"')["input_ids"][1:]
    assert ids.count(emb.encoder.placeholder_id) == 1
    assert emb.encoder.placeholder_id >= tokenizer.vocab_size  # a new id, never a real token


def test_placeholder_ids_match_the_official_code(llama2_tokenizer_path):
    """METHODS.md: the official code's ids with Llama 2's fast tokenizer."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import AutoTokenizer

    from kvembed.methods import resolve
    from kvembed.runtime.encoding import TextEncoder

    hf = AutoTokenizer.from_pretrained(llama2_tokenizer_path)
    encoder = TextEncoder(Tokenizer.from_str(hf.backend_tokenizer.to_str()), resolve("token-prepending", 32), 4096)
    pst = encoder.placeholder_id
    expected = [1, 910, 10541, 584, pst, 376, 29909, 767, 338, 8743, 263, 11210, 1213, 2794, 297, 697, 1734, 6160]
    assert list(encoder.encode_one("A man is playing a guitar.").ids) == expected
    # and the oracle's registration of <PST>, on the tokenizer.json itself, too
    official = Tokenizer.from_file(str(llama2_tokenizer_path / "tokenizer.json"))
    official.add_tokens([AddedToken(independent.PLACEHOLDER, lstrip=True)])
    prompt = independent.TP_PROMPTS["prompteol"].replace("{text}", "A man is playing a guitar.")
    assert official.encode(prompt).ids == expected[:4] + [official.token_to_id("<PST>")] + expected[5:]


def test_token_prepending_window_matters(model_paths, oracle):
    path = model_paths["llama"]
    default = embedder(path, "token-prepending").encode(TEXTS)
    empty_window = embedder(path, "token-prepending", tp_start=1, tp_stop=1).encode(TEXTS)
    wide = embedder(path, "token-prepending", tp_start=0, tp_stop=3).encode(TEXTS)
    assert np.abs(default - empty_window).max() > 1e-3
    assert np.abs(default - wide).max() > 1e-3
    expected = np.stack([oracle("llama").embed("token-prepending", t, tp_start=1, tp_stop=1) for t in TEXTS])
    assert_same(empty_window, expected)


@pytest.mark.parametrize("exit_layer", [1, 2, 4])
def test_token_prepending_exit_layer(model_paths, oracle, exit_layer):
    emb = embedder(model_paths["qwen3"], "token-prepending", exit_layer=exit_layer)
    assert emb.method.layers_needed == exit_layer
    expected = np.stack([oracle("qwen3").embed("token-prepending", t, exit_layer=exit_layer) for t in TEXTS])
    assert_same(emb.encode(TEXTS), expected)


# ----- prompts and token ids: METHODS.md, literally --------------------------------------------

#: every prompt of METHODS.md: (method, options) -> what the oracle calls it
PROMPT_CASES = [
    ("kv-embedding", {}), ("va", {}), ("last-token", {}), ("mean", {}), ("echo", {}), ("prompteol", {}),
    ("aligned-wva", {"prompt": "prompteol"}), ("aligned-wva", {"prompt": "futureeol"}),
    ("token-prepending", {"prompt": "prompteol"}), ("token-prepending", {"prompt": "cot"}),
    ("token-prepending", {"prompt": "ke"}),
]
LONG_TEXT = "A long text about " + "cats and dogs and birds, " * 60 + 'with "quotes" at the end?'


@pytest.mark.parametrize("method,options", PROMPT_CASES, ids=[f"{m}-{o.get('prompt', '')}" for m, o in PROMPT_CASES])
def test_token_ids_are_the_oracle_s(model_paths, oracle, method, options):
    """kvembed's ids (prompt, clean-up, <PST>, echo span, truncation of a text longer than
    max_length) equal the oracle's, built from METHODS.md's literal prompt strings."""
    emb = embedder(model_paths["stories260k"], method, **options)
    reference = oracle("stories260k")
    for kind in ("query", "document"):
        for text in [*TEXTS, "", "  spaced   out  ", LONG_TEXT]:
            ours = emb.encoder.encode_one(text, kind)
            theirs = reference.tokenize(method, text, kind, options.get("prompt"))
            assert list(ours.ids) == theirs.ids, (kind, text)
            assert ours.truncated == theirs.truncated and len(ours.ids) <= reference.max_length
            if method == "echo":
                assert list(ours.pool) == theirs.pool, (kind, text)
            if method == "token-prepending":
                assert ours.ids.index(emb.encoder.placeholder_id) == theirs.pst_index


def test_prompt_templates_are_methods_md_s():
    """The templates themselves, against METHODS.md's strings (a clear message when one drifts)."""
    from kvembed.methods import resolve

    assert resolve("kv-embedding", 8).templates == independent.KV_PROMPTS
    expected = {
        ("aligned-wva", "prompteol"): independent.PROMPTEOL, ("aligned-wva", "futureeol"): independent.FUTUREEOL,
        ("prompteol", None): independent.PROMPTEOL, ("echo", None): independent.ECHO,
        **{("token-prepending", name): template for name, template in independent.TP_PROMPTS.items()},
        **{(name, None): "{text}" for name in ("va", "last-token", "mean")},
    }
    for (method, prompt), template in expected.items():
        options = {} if prompt is None else {"prompt": prompt}
        assert resolve(method, 8, **options).templates == {"query": template, "document": template}, (method, prompt)


@pytest.mark.parametrize("method,options", [("token-prepending", {}), ("prompteol", {}), ("kv-embedding", {}), ("echo", {})])
def test_truncated_texts_match_the_oracle(model_paths, oracle, method, options):
    """A text longer than max_length: the prompt's closing words survive, the text is cut where
    the oracle cuts it, and the embedding is the oracle's."""
    emb = embedder(model_paths["stories260k"], method, **options)
    with pytest.warns(UserWarning, match="max_length"):
        got = emb.encode([LONG_TEXT, "short"])
    want = np.stack([oracle("stories260k").embed(method, t, **oracle_options("stories260k", method, options))
                     for t in (LONG_TEXT, "short")])
    assert_same(got, want)


@pytest.mark.parametrize("method", ["kv-embedding", "mean", "echo", "prompteol"])
def test_token_ids_equal_the_hf_tokenizer(model_paths, method):
    """A second, independent tokenisation: transformers' tokenizer on the literal prompt."""
    from transformers import AutoTokenizer

    template, clean = independent._template(method, "document", None)
    emb = embedder(model_paths["stories260k"], method)
    tokenizer = AutoTokenizer.from_pretrained(model_paths["stories260k"])
    for text in TEXTS:
        prompt = template.replace("{text}", independent.official_clean(text) if clean else text)
        assert list(emb.encoder.encode_one(text).ids) == tokenizer(prompt)["input_ids"]


def test_placeholder_in_the_user_s_text_is_refused_by_name(model_paths):
    """A text containing "<PST>" would put a second placeholder in the prompt: refused with a
    ValueError naming it (never a silently wrong position)."""
    emb = embedder(model_paths["stories260k"], "token-prepending")
    with pytest.raises(ValueError, match="<PST>"):
        emb.encode(["fine", "a text that mentions <PST> itself"])
    assert emb.encode(["a text that mentions <PST itself"]).shape == (1, emb.dim)  # not a placeholder


# ----- threads --------------------------------------------------------------------------------


def test_encode_from_several_threads_matches_serial(model_paths):
    """Patching mutates the shared decoder: two embedders sharing one decoder (kv-embedding's
    re-routing, token-prepending's hooks and early exit), called from four threads at once."""
    from kvembed.methods import resolve

    kv = embedder(model_paths["stories260k"], "kv-embedding")
    tp = TorchEmbedder(kv.model.decoder, kv.hf_tokenizer, resolve("token-prepending", 5), kv.max_length)
    texts = [f"text number {i} about cats " * (i % 5 + 1) for i in range(12)]
    serial = {"kv": kv.encode(texts, batch_size=2), "tp": tp.encode(texts, batch_size=2)}
    jobs = ["kv", "tp"] * 4
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda name: (kv if name == "kv" else tp).encode(texts, batch_size=2), jobs))
    for name, result in zip(jobs, results):
        np.testing.assert_allclose(result, serial[name], atol=1e-6, err_msg=name)
    assert len(kv.model.decoder.layers) == 5 and kv.model.decoder.config._attn_implementation != "kvembed"


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
    with pytest.warns(UserWarning, match="max_length"):
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
    with pytest.raises(ValueError, match="supports cohere, gemma2, gemma3_text, granite, llama, mistral, olmo2, phi3, qwen2, qwen3, stablelm"):
        TorchEmbedder.from_pretrained(tmp_path, "mean")


def test_phi3_with_longrope_is_refused_in_one_line(tiny_models, tmp_path):
    """longrope picks its frequencies by the batch's longest text: refused, not computed batch-dependently."""
    import json
    import shutil

    folder = shutil.copytree(tiny_models["phi3"], tmp_path / "phi3")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["rope_parameters"] = {**config["rope_parameters"], "rope_type": "longrope",
                                 "short_factor": [1.0] * 4, "long_factor": [4.0] * 4}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ValueError, match="unsupported rope_type 'longrope' for phi3; expected default") as refused:
        TorchEmbedder.from_pretrained(folder, "mean")
    assert "\n" not in str(refused.value)


#: (family, config switch kvembed does not prove for it): each refused in one line before loading
REFUSED_SWITCHES = [("stablelm", "qk_layernorm"), ("stablelm", "use_parallel_residual"), ("cohere", "use_qk_norm")]


@pytest.mark.parametrize("arch,switch", REFUSED_SWITCHES, ids=[f"{a}-{s}" for a, s in REFUSED_SWITCHES])
def test_an_unproven_switch_is_refused_in_one_line(tiny_models, tmp_path, arch, switch):
    import json
    import shutil

    folder = shutil.copytree(tiny_models[arch], tmp_path / arch)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**config, switch: True}), encoding="utf-8")
    with pytest.raises(ValueError, match=f"{arch} with {switch} is not supported") as refused:
        TorchEmbedder.from_pretrained(folder, "mean")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("cap", [0.0, -50.0, 1e400, float("nan")], ids=["zero", "negative", "inf", "nan"])
def test_a_soft_cap_that_is_not_a_positive_number_is_refused_in_one_line(tiny_models, tmp_path, cap):
    """Gemma 2's attn_logit_softcapping divides the logits: zero, a negative, an infinite or a NaN
    cap (floats, which transformers' own config check lets through) would give NaN or flipped
    attention, so a config.json saying so is refused before the weights load."""
    import json
    import shutil

    folder = shutil.copytree(tiny_models["gemma2"], tmp_path / "gemma2")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**config, "attn_logit_softcapping": cap}), encoding="utf-8")
    with pytest.raises(ValueError, match="gemma2: attn_logit_softcapping must be a positive number or null") as refused:
        TorchEmbedder.from_pretrained(folder, "mean")
    assert "\n" not in str(refused.value)


def test_missing_model_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model folder"):
        TorchEmbedder.from_pretrained(tmp_path / "nope", "mean")


def test_wrong_kind(model_paths):
    with pytest.raises(ValueError, match="kind must be one of query, document"):
        embedder(model_paths["stories260k"], "mean").encode(["x"], kind="passage")


def test_a_patched_block_left_open_at_exit_ends_quietly(model_paths):
    """A script that enters ``patched()`` (e.g. through an ExitStack) and never closes it: the
    block is closed while the interpreter tears torch down; no 'Exception ignored' noise."""
    script = (
        "import contextlib\n"
        "from kvembed.modeling.reference import TorchEmbedder\n"
        f"embedder = TorchEmbedder.from_pretrained({str(model_paths['stories260k'])!r}, 'kv-embedding')\n"
        "stack = contextlib.ExitStack()\n"
        "stack.enter_context(embedder.model.patched())\n"
        "print('patched', embedder.model.decoder.layers is not None)\n"
    )
    done = run_python(script, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "patched True" in done.stdout
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr
