"""Gemma 3 270M's tokenizer as kvembed builds it from the GGUF: plain ``tokenizer(text)`` starts
with ``<bos>`` (and ends without ``<eos>``), exactly as the GGUF header asks and as transformers'
GGUF loader tokenises, in the dequantized cache folder the reference loads and in an exported
artifact's ``tokenizer.json`` that the torch-free runtime reads.

The independent side is the GGUF file itself, read with the ``gguf`` package: its
``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` flags and BOS id, and its token list, from
which the ids must spell the text back (``▁`` as a space, ``<0xNN>`` pieces as bytes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import TEXTS

TOKENIZER_TEXTS = TEXTS + ["  two leading spaces", "tabs\tand\nnewlines", "<bos> typed by a user", "", "x" * 40]


@pytest.fixture(scope="module")
def gguf_file() -> Path:
    from kvembed.methods.models import packaged_part_files
    from kvembed.modeling.sources import locate_model

    try:
        packaged_part_files("gemma3-270m")
    except FileNotFoundError as err:
        pytest.skip(f"the Gemma 3 270M packages are not installed ({err})")
    pytest.importorskip("gguf", reason="the gguf package (kvembed[gguf]) is not installed")
    return Path(locate_model("gemma3-270m").location)


@pytest.fixture(scope="module")
def header(gguf_file) -> dict:
    """The GGUF's own tokenizer facts: the flags, the special ids and every token's piece."""
    import gguf

    from kvembed.modeling.gguf import gguf_field

    reader = gguf.GGUFReader(str(gguf_file), "r")
    field = reader.fields["tokenizer.ggml.tokens"]
    facts = {key: gguf_field(reader, gguf, f"tokenizer.ggml.{key}")
             for key in ("add_bos_token", "add_eos_token", "bos_token_id", "eos_token_id")}
    return {**facts, "pieces": [bytes(field.parts[i]).decode("utf-8") for i in field.data]}


@pytest.fixture(scope="module")
def loader_tokenizer(gguf_file):
    """transformers' GGUF loader: the source of truth for how the file tokenises."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)


def spell(ids: list[int], pieces: list[str]) -> str:
    """The text that token ids stand for, from the GGUF's token list (SentencePiece-style pieces)."""
    out = bytearray()
    for piece in (pieces[i] for i in ids):
        byte = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
        out += bytes([int(byte.group(1), 16)]) if byte else piece.replace("\u2581", " ").encode("utf-8")
    return out.decode("utf-8")


def test_the_gguf_asks_for_bos_and_the_loader_adds_it(header, loader_tokenizer):
    assert header["add_bos_token"] is True and header["add_eos_token"] is False
    assert header["bos_token_id"] == 2 and header["pieces"][2] == "<bos>" and loader_tokenizer.bos_token_id == 2
    for text in TOKENIZER_TEXTS:
        ids = loader_tokenizer(text).input_ids
        assert ids[0] == 2 and header["eos_token_id"] not in ids, (text, ids)
        assert spell(ids[1:], header["pieces"]) == text.replace("<bos>", header["pieces"][2])


def test_the_cache_folder_and_its_tokenizer_json_tokenise_like_the_loader(gguf_file, loader_tokenizer):
    """The folder the reference loads (AutoTokenizer) and its bare tokenizer.json (the tokenizers
    library, as the runtime reads one) give the loader's ids, BOS first."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from kvembed.modeling.gguf import materialize

    folder = materialize(gguf_file)
    reloaded = AutoTokenizer.from_pretrained(str(folder))
    bare = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text in TOKENIZER_TEXTS:
        expected = loader_tokenizer(text).input_ids
        assert reloaded(text).input_ids == expected, text
        assert bare.encode(text).ids == expected, text


@pytest.fixture(scope="module")
def artifact(gguf_file, traces, tmp_path_factory) -> Path:
    """The real 270M exported (fp32, through the parity gate): its tokenizer.json and manifest are
    what the torch-free runtime tokenises with. The exporter writes the loaded tokenizer whatever
    the graph, so the method is the cheapest one with a prompt around the text and no text
    clean-up: aligned-wva reading layer 0 traces one decoder layer of eighteen."""
    return traces.get("gemma3-270m", "aligned-wva", layers="0", max_length=128).write(
        tmp_path_factory.mktemp("gemma3-270m") / "awva", "fp32").path


def test_the_exported_artifact_tokenises_like_the_loader(artifact, loader_tokenizer, header):
    """The runtime's encoder of the artifact: the method's prompt around each text, tokenised with
    BOS first and the same ids as transformers' GGUF loader gives for that prompt."""
    from kvembed.artifact.manifest import load_manifest
    from kvembed.runtime.artifact import encoder_from_manifest

    manifest = load_manifest(artifact)
    assert set(manifest.method.templates) == {"query", "document"}
    assert all(template != "{text}" for template in manifest.method.templates.values())  # a prompt around the text
    encoder = encoder_from_manifest(artifact, manifest)
    for kind, template in manifest.method.templates.items():
        for text in TOKENIZER_TEXTS:
            prompt = template.replace("{text}", text)
            expected = loader_tokenizer(prompt).input_ids
            got = list(encoder.encode_one(text, kind).ids)
            assert got == expected and len(got) < 128, (kind, text)
            assert got[0] == 2 and spell(got[1:], header["pieces"]).startswith(prompt[:10])
