"""The independent recomputation of METHODS.md's causal2vec from a checkpoint's weights (plain
transformers + torch, no kvembed code); the random BERT encoder it is checked on is
:func:`kvembed.bench.synthetic.build_bert`."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F


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
