"""Causal2Vec: checkpoint layout, PyTorch reference, export, runtime (issue 16).

Random-weight checkpoints: a tiny BERT (real WordPiece tokenizer trained here) and the tiny
Llama/Qwen3/Mistral of conftest, assembled by ``kvembed causal2vec assemble``. The reference is
checked against ``independent_causal2vec`` (plain transformers + torch from the saved weights)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import httpx

from causal2vec_util import independent_causal2vec

from kvembed.bench.synthetic import build_bert
from conftest import TEXTS
from kvembed.modeling.causal2vec import Causal2VecCheckpoint, assemble
from kvembed.export.core import Exporter
from kvembed.export.graph.ops import op_types
from kvembed.modeling.reference import TorchEmbedder
from kvembed.runtime import Embedder
from kvembed.bench.served import ServerProcess

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ARCHES = ("llama", "qwen3", "mistral")


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return build_bert(tmp_path_factory.mktemp("bert") / "encoder")


@pytest.fixture(scope="module")
def checkpoints(bert, tiny_models, tmp_path_factory) -> dict[str, Path]:
    """arch -> an assembled (untrained) checkpoint written by the CLI."""
    root = tmp_path_factory.mktemp("c2v")
    out = {}
    for seed, arch in enumerate(ARCHES):
        target = root / arch
        result = subprocess.run(
            [sys.executable, "-m", "kvembed.cli", "causal2vec", "assemble", "--encoder", str(bert),
             "--llm", str(tiny_models[arch]), "--out", str(target), "--seed", str(seed)],
            capture_output=True, text=True, timeout=300,
        )
        assert result.returncode == 0, result.stderr
        assert "untrained" in result.stdout
        out[arch] = target
    return out


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("arch", ARCHES)
def test_reference_equals_independent_recomputation(checkpoints, arch):
    embedder = TorchEmbedder.from_pretrained(checkpoints[arch], "causal2vec")
    assert embedder.dim == 2 * embedder.model.decoder.config.hidden_size  # [h(C); h(EOS)]
    for kind in ("query", "document"):
        got = embedder.encode(TEXTS, kind)
        want = independent_causal2vec(checkpoints[arch], TEXTS, kind).numpy()
        assert cosines(got, want).min() >= 0.99999, kind
        assert np.abs(got - want).max() <= 1e-4, kind
    # the query instruction changes the vectors; the Contextual token matters
    assert cosines(embedder.encode(TEXTS, "query"), embedder.encode(TEXTS, "document")).max() < 0.9999


def test_padding_side_and_batching_do_not_change_vectors(checkpoints):
    right = TorchEmbedder.from_pretrained(checkpoints["qwen3"], "causal2vec")
    left = TorchEmbedder.from_pretrained(checkpoints["qwen3"], "causal2vec", padding_side="left")
    batched = right.encode(TEXTS)
    alone = np.stack([right.encode([text])[0] for text in TEXTS])
    assert np.abs(batched - alone).max() <= 1e-5
    assert np.abs(left.encode(TEXTS) - batched).max() <= 1e-5


def test_export_passes_the_gate_and_the_runtime_matches(checkpoints, tmp_path):
    reference = TorchEmbedder.from_pretrained(checkpoints["llama"], "causal2vec")
    with Exporter(reference) as exporter:
        results = {precision: exporter.write(tmp_path / precision, precision) for precision in ("fp32", "fp16", "int8")}
    manifest = results["fp32"].manifest.raw
    assert [i["name"] for i in manifest["inputs"]] == [
        "input_ids", "attention_mask", "pool_mask", "encoder_input_ids", "encoder_attention_mask"]
    assert manifest["context_encoder"]["tokenizer"] == "encoder_tokenizer.json"
    assert manifest["source"]["causal2vec"]["adapter_merged"] is False
    assert manifest["graph"]["tensorrt_ready"]
    # the BERT encoder's ops need a newer TensorRT than the decoder's Attention (10.14): Gelu, from 10.15
    ops = op_types(onnx.load(str(tmp_path / "fp32" / "model.onnx"), load_external_data=False))
    assert {"Gelu", "LayerNormalization", "Attention"} <= set(ops)
    assert manifest["graph"]["attention"]["min_versions"]["tensorrt"] == "10.15"
    want = independent_causal2vec(checkpoints["llama"], TEXTS, "query").numpy()
    floors = {"fp32": 0.99999, "fp16": 0.999, "int8": 0.99}
    for precision, result in results.items():
        assert result.manifest.raw["parity"]["passed"], precision
        runtime = Embedder.load(tmp_path / precision, provider="cpu")
        got = runtime.encode(TEXTS, kind="query")
        assert got.shape == want.shape
        assert cosines(got, want).min() >= floors[precision], precision
    fp32 = Embedder.load(tmp_path / "fp32", provider="cpu")
    assert np.abs(fp32.encode(TEXTS, kind="document") - reference.encode(TEXTS, "document")).max() <= 1e-4
    with pytest.raises(ValueError, match="token ids are accepted only"):
        fp32.encode_ids([[1, 5, 6]])
    server = ServerProcess([f"c2v={tmp_path / 'fp32'}", "--provider", "cpu"], tmp_path / "serve.log").wait_healthy()
    try:  # kvembed serve: the server tokenises for both the encoder and the LLM
        body = httpx.post(f"{server.url}/v1/embeddings", json={"model": "c2v", "input": TEXTS, "input_type": "query"},
                          timeout=60).json()
    finally:
        server.stop()
    served = np.asarray([item["embedding"] for item in body["data"]], dtype=np.float32)
    assert np.abs(served - fp32.encode(TEXTS, kind="query")).max() <= 1e-5
    from kvembed.triton.repository import write_repository

    with pytest.raises(ValueError, match="Causal2Vec artifact"):
        write_repository([tmp_path / "fp32"], tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_peft_adapter_merge_equals_a_premerged_checkpoint(checkpoints, tmp_path):
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    source = checkpoints["qwen3"]
    with_adapter = tmp_path / "adapter-ckpt"
    shutil.copytree(source, with_adapter)
    torch.manual_seed(7)
    base = AutoModelForCausalLM.from_pretrained(source / "llm")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    lora = peft.get_peft_model(base, config)
    lora.save_pretrained(with_adapter / "adapter")
    premerged = tmp_path / "merged-ckpt"
    shutil.copytree(source, premerged)
    shutil.rmtree(premerged / "llm")
    lora.merge_and_unload().save_pretrained(premerged / "llm")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / "llm" / name, premerged / "llm" / name)

    merged_at_load = TorchEmbedder.from_pretrained(with_adapter, "causal2vec")
    assert merged_at_load.causal2vec["adapter_merged"] is True
    a = merged_at_load.encode(TEXTS)
    b = TorchEmbedder.from_pretrained(premerged, "causal2vec").encode(TEXTS)
    c = TorchEmbedder.from_pretrained(source, "causal2vec").encode(TEXTS)
    assert np.abs(a - b).max() <= 1e-5
    assert np.abs(a - c).max() > 1e-3  # the adapter is not a no-op


def _broken(source: Path, target: Path, how: str) -> Path:
    shutil.copytree(source, target)
    if how == "missing projector":
        (target / "projector.safetensors").unlink()
    elif how == "width mismatch":
        from safetensors.numpy import save_file

        save_file({"fc1.weight": np.zeros((48, 32), np.float32), "fc1.bias": np.zeros(48, np.float32),
                   "fc2.weight": np.zeros((48, 48), np.float32), "fc2.bias": np.zeros(48, np.float32)},
                  str(target / "projector.safetensors"))
    elif how == "placeholder not in vocabulary":
        config = json.loads((target / "causal2vec.json").read_text())
        config["placeholder"] = "<|no-such-token|>"
        (target / "causal2vec.json").write_text(json.dumps(config))
    elif how == "no causal2vec.json":
        (target / "causal2vec.json").unlink()
    return target


@pytest.mark.parametrize("how, message", [
    ("missing projector", "has no projector.safetensors"),
    ("width mismatch", r"fc1.weight is \[48, 32\], expected \[64, 32\]"),
    ("placeholder not in vocabulary", "is not a token of the LLM's vocabulary"),
    ("no causal2vec.json", "has no causal2vec.json"),
])
def test_bad_layouts_are_one_line_errors(checkpoints, tmp_path, how, message):
    broken = _broken(checkpoints["qwen3"], tmp_path / "broken", how)
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        TorchEmbedder.from_pretrained(broken, "causal2vec")
    result = subprocess.run(
        [sys.executable, "-m", "kvembed.cli.export", "--model", str(broken), "--method", "causal2vec", "--out",
         str(tmp_path / "out")], capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1, result.stderr
    assert not (tmp_path / "out").exists()


def test_assemble_refuses_an_occupied_folder_and_reads_back(checkpoints, bert, tiny_models, tmp_path):
    target = tmp_path / "ck"
    assemble(bert, tiny_models["mistral"], target, seed=3)
    written = json.loads((target / "causal2vec.json").read_text())
    tokens = json.loads((tiny_models["mistral"] / "tokenizer_config.json").read_text())
    assert written["placeholder"] == tokens["bos_token"] and written["eos"] == tokens["eos_token"]
    options = Causal2VecCheckpoint.read(target).method_options()
    assert options["query_template"] == written["templates"]["query"] and options["placeholder"] == written["placeholder"]
    with pytest.raises(FileExistsError, match="--force"):
        assemble(bert, tiny_models["mistral"], target)
    with pytest.raises(ValueError, match="unsupported architecture 'bert'"):  # an encoder given as the LLM
        assemble(bert, bert, tmp_path / "wrong")
    assert not (tmp_path / "wrong").exists()


def test_assemble_replaces_an_occupied_folder_only_when_it_succeeds(bert, tiny_models, tmp_path, monkeypatch):
    target = tmp_path / "ck"
    target.mkdir()
    (target / "earlier").write_text("earlier")
    with pytest.raises(FileExistsError, match="--force"):
        assemble(bert, tiny_models["llama"], target)

    def disk_full(*args, **kwargs):
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr("safetensors.numpy.save_file", disk_full)  # fails after the folders are copied
        with pytest.raises(OSError, match="disk full"):
            assemble(bert, tiny_models["llama"], target, force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["ck"] and [p.name for p in target.iterdir()] == ["earlier"]
    assemble(bert, tiny_models["llama"], target, force=True)
    assert sorted(p.name for p in target.iterdir()) == sorted(["encoder", "llm", "projector.safetensors", "causal2vec.json"])


def test_command_line_exports_and_embeds_a_checkpoint(checkpoints, tmp_path):
    """kvembed-export --model CHECKPOINT --method causal2vec, then kvembed embed on the artifact."""
    out = tmp_path / "artifact"
    export = subprocess.run(
        [sys.executable, "-m", "kvembed.cli.export", "--model", str(checkpoints["mistral"]), "--method", "causal2vec",
         "--out", str(out)], capture_output=True, text=True, timeout=600,
    )
    assert export.returncode == 0, export.stderr
    embed = subprocess.run(
        [sys.executable, "-m", "kvembed.cli", "embed", str(out), "a cat sat", "--kind", "query", "--output",
         str(tmp_path / "v.npy")], capture_output=True, text=True, timeout=300,
    )
    assert embed.returncode == 0, embed.stderr
    got = np.load(tmp_path / "v.npy")[0]
    want = independent_causal2vec(checkpoints["mistral"], ["a cat sat"], "query").numpy()[0]
    assert float(got @ want) / float(np.linalg.norm(got) * np.linalg.norm(want)) >= 0.99999
