"""Random-weight models of a real model's *shape*, for benchmarks without downloading weights.

Latency and memory depend on the shape (layers, widths, heads), not on the weight values, so a
randomly initialised Qwen3 with Qwen3-0.6B's widths measures what Qwen3-0.6B would cost. The
tokenizer is the demo model's byte-level one (259 tokens), so the embedding table is small;
the FLOP count (:mod:`kvembed.bench.peak`) excludes the embedding lookup anyway.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..errors import InvalidInput

#: Qwen3-0.6B's decoder widths (its config.json); ``layers`` is chosen per benchmark (28 in the real model)
QWEN3_06B = {"hidden": 1024, "heads": 16, "kv_heads": 8, "head_dim": 128, "ffn": 3072}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def build_random_model(
    out_dir: str | os.PathLike[str],
    *,
    layers: int = 8,
    hidden: int = 1024,
    heads: int = 16,
    kv_heads: int = 8,
    head_dim: int = 128,
    ffn: int = 3072,
    vocab_size: int | None = None,
    max_positions: int = 4096,
    seed: int = 0,
) -> Path:
    """Save a randomly initialised Qwen3 (safetensors) with the demo tokenizer into ``out_dir``.

    Weights use transformers' own initialisation (normal, std ``initializer_range=0.02``; norms at
    one), which keeps activations finite through many layers. ``vocab_size`` defaults to the
    tokenizer's size; positions and the tokenizer's ``model_max_length`` are ``max_positions``
    (>= 2048), so long sequences can be benchmarked.
    """
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    from ..methods import demo_model_path

    for name, value in (("layers", layers), ("hidden", hidden), ("heads", heads), ("kv_heads", kv_heads),
                        ("head_dim", head_dim), ("ffn", ffn)):
        if int(value) < 1:
            raise InvalidInput(f"{name} must be >= 1, got {value}")
    if heads % kv_heads:
        raise InvalidInput(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    if max_positions < 2048:
        raise InvalidInput(f"max_positions must be >= 2048, got {max_positions}")
    demo = demo_model_path()
    tokenizer_size = Tokenizer.from_file(str(demo / "tokenizer.json")).get_vocab_size()
    vocab = int(vocab_size or tokenizer_size)
    if vocab < tokenizer_size:
        raise InvalidInput(f"vocab_size {vocab} is smaller than the tokenizer's {tokenizer_size} tokens")
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        initializer_range=0.02,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # "Writing model shards" bars
    try:
        model.save_pretrained(out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    copy_demo_tokenizer(out, max_positions)
    (out / "README.md").write_text(
        f"Random-weight Qwen3 ({layers} layers, hidden {hidden}, {heads}/{kv_heads} heads x {head_dim}, "
        f"ffn {ffn}, vocab {vocab}), built by kvembed.bench.synthetic.build_random_model(seed={seed}) "
        "for benchmarks. Its embeddings mean nothing; its cost is that of the shape.\n",
        encoding="utf-8",
    )
    return out


def copy_demo_tokenizer(out: Path, max_positions: int, source: str | None = None) -> None:
    """A tokenizer into ``out`` for a random model of a real shape (which has none of its own),
    its ``model_max_length`` raised to ``max_positions``: the demo model's byte-level one, or with
    ``source`` (a model folder, alias or GGUF file kvembed can load) that model's, for as many
    tokens per text as a real tokenizer gives."""
    from ..methods import demo_model_path

    origin = demo_model_path() if source is None else tokenizer_folder(source)
    for name in TOKENIZER_FILES:
        shutil.copy(origin / name, out / name)
    settings_path = out / "tokenizer_config.json"
    settings = json.loads(settings_path.read_text(encoding="utf-8"))
    settings["model_max_length"] = max_positions  # the demo's says 512
    settings_path.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def tokenizer_folder(source: str) -> Path:
    """The folder holding ``source``'s tokenizer.json: a folder, or an alias / GGUF file (its
    converted folder in kvembed's cache)."""
    from ..modeling.gguf import find_gguf, materialize
    from ..methods import resolve_model

    location = Path(source) if Path(source).exists() else Path(resolve_model(source)[0])
    gguf = find_gguf(location)
    folder = materialize(gguf) if gguf is not None else location
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json for {source!r} (looked in {folder}): give a model folder, "
                                "an alias kvembed knows (e.g. smollm2-135m) or a GGUF file")
    return folder


#: BERT's special tokens, in its vocabulary's order
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_bert(folder: Path, hidden: int = 32, seed: int = 0, layers: int = 2, heads: int = 4,
               max_positions: int = 128) -> Path:
    """A random BERT (2 layers by default; ``hidden=768, layers=12, heads=12, max_positions=512``
    is BERT-base's shape) saved with save_pretrained, and its fast WordPiece tokenizer trained on
    the bundled calibration texts: a Causal2Vec context encoder of a real shape, without a download."""
    import torch
    from tokenizers import BertWordPieceTokenizer, processors
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    from ..modeling.layers.calibration import builtin_calibration_path  # real English to train the WordPiece vocab on

    folder.mkdir(parents=True, exist_ok=True)
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(builtin_calibration_path().read_text(encoding="utf-8").splitlines(), vocab_size=400, special_tokens=BERT_SPECIALS, show_progress=False)
    wordpiece._tokenizer.post_processor = processors.BertProcessing(  # [CLS] text [SEP], as BERT's own
        ("[SEP]", wordpiece.token_to_id("[SEP]")), ("[CLS]", wordpiece.token_to_id("[CLS]"))
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=wordpiece._tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", model_max_length=max_positions,
    )
    fast.save_pretrained(folder)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=fast.backend_tokenizer.get_vocab_size(), hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=(4 if layers > 2 else 2) * hidden, max_position_embeddings=max_positions,
    )
    BertModel(config, add_pooling_layer=False).save_pretrained(folder)
    return folder


#: 1_Pooling/config.json's switches, one of which a folder turns on
POOLING_SWITCHES = ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens", "pooling_mode_lasttoken")


def write_sentence_transformers_files(folder: Path, mode: str, prompts: dict[str, str], eos_id: int,
                                      max_seq_length: int = 256) -> Path:
    """Turn a saved decoder ``folder`` into a sentence-transformers folder as ``SentenceTransformer.save()``
    writes one for a trained decoder embedder (Qwen3-Embedding, gte-Qwen2, e5-mistral): modules.json
    (Transformer, Pooling, Normalize), ``1_Pooling`` with ``mode`` on, the named ``prompts``, and a
    tokenizer whose post-processor appends the token ``eos_id`` (these models are trained with it)."""
    tokenizer_path = folder / "tokenizer.json"
    tokenizer = json.loads(tokenizer_path.read_text(encoding="utf-8"))
    eos = next(t for t in tokenizer["added_tokens"] if t["id"] == eos_id)["content"]
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": eos, "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
        "special_tokens": {eos: {"id": eos, "ids": [eos_id], "tokens": [eos]}},
    }
    tokenizer_path.write_text(json.dumps(tokenizer), encoding="utf-8")
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (folder / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": config["hidden_size"], **{key: key == mode for key in POOLING_SWITCHES},
         "include_prompt": True}), encoding="utf-8")
    (folder / "2_Normalize").mkdir(exist_ok=True)
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}), encoding="utf-8")
    (folder / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"}), encoding="utf-8")
    return folder
