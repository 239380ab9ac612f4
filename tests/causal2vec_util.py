"""Tiny Causal2Vec parts for tests: a random BERT encoder with a real WordPiece tokenizer trained
here (the `tokenizers` library's own trainer), and the independent recomputation of METHODS.md's
causal2vec from the checkpoint's weights (plain transformers + torch, no kvembed code)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from kvembed.modeling.layers.calibration import builtin_calibration_path  # real English to train the WordPiece vocab on

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_bert(folder: Path, hidden: int = 32, seed: int = 0, layers: int = 2, heads: int = 4,
               max_positions: int = 128) -> Path:
    """A random BERT (2 layers by default; ``hidden=768, layers=12, heads=12, max_positions=512``
    is BERT-base's shape) saved with save_pretrained, and its fast WordPiece tokenizer."""
    from tokenizers import BertWordPieceTokenizer, processors
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(builtin_calibration_path().read_text(encoding="utf-8").splitlines(), vocab_size=400, special_tokens=SPECIALS, show_progress=False)
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


def independent_causal2vec(checkpoint: Path, texts: list[str], kind: str) -> torch.Tensor:
    """METHODS.md's causal2vec computed from the checkpoint's files, one text at a time (no padding).

    The placeholder's position is found by tokenising the prompt up to and including it (the
    placeholder is a special token, so the prefix's tokens are those of the whole prompt)."""
    from safetensors.torch import load_file
    from transformers import AutoModel, AutoTokenizer

    config = json.loads((checkpoint / "causal2vec.json").read_text())
    bert = AutoModel.from_pretrained(checkpoint / "encoder", add_pooling_layer=False).eval()
    bert_tokenizer = AutoTokenizer.from_pretrained(checkpoint / "encoder")
    llm = AutoModel.from_pretrained(checkpoint / "llm").eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint / "llm")
    w = load_file(str(checkpoint / "projector.safetensors"))
    template = config["templates"][kind]
    head = template[: template.index("{context}")] + config["placeholder"]
    rows = []
    with torch.no_grad():
        for text in texts:
            encoded = bert_tokenizer(text, return_tensors="pt", truncation=True, max_length=128)
            h = bert(**encoded).last_hidden_state[0]
            contextual = F.linear(F.gelu(F.linear(h.mean(dim=0), w["fc1.weight"], w["fc1.bias"])), w["fc2.weight"], w["fc2.bias"])
            prompt = template.replace("{context}", config["placeholder"]).replace("{text}", text) + config["eos"]
            ids = tokenizer(prompt)["input_ids"]
            position = len(tokenizer(head)["input_ids"]) - 1
            assert ids[position] == tokenizer.convert_tokens_to_ids(config["placeholder"])
            embeds = llm.get_input_embeddings()(torch.tensor([ids]))[0].clone()
            embeds[position] = contextual
            out = llm(inputs_embeds=embeds[None]).last_hidden_state[0]
            rows.append(F.normalize(torch.cat([out[position], out[-1]]), dim=0))
    return torch.stack(rows)
