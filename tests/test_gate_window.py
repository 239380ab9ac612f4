"""The parity gate past a sliding window: a model whose attention slides over fewer tokens than its
max_length gets one more gated text, cut by its own tokenizer to run past the window, so the exported
graph's windowed mask is checked where it matters; a graph that ignores the window is refused, though
the gate's other texts (all inside the window) would pass it; verify re-runs the same texts; a model
without a window gets exactly the gate it had. Token counts come from the independent oracle's
tokenizer (tests/independent.py), and the wrong graph is caught against a second PyTorch reference."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config

from independent import Oracle
from kvembed.export.core import Exporter, ParityError, load_embedder
from kvembed.export.gate.texts import WINDOW_MARGIN
from kvembed.export.gate.parity import GATE_TEXTS, gate_batches, gate_tokens, model_gate_texts, run_parity
from kvembed.export.gate.certify import gate_session
from kvembed.export.gate.targets import CPU
from kvembed.export.gate.verification import verify
from kvembed.methods.architectures import sliding_window
from kvembed.runtime.artifact import encoder_from_manifest
from kvembed.artifact import read_manifest
from test_gemma3 import WINDOW, build_tiny_gemma3

pytestmark = pytest.mark.usefixtures("one_torch_thread")

METHOD = "kv-embedding"
NAME = "past-window"


def oracle_length(oracle: Oracle, text: str, kind: str) -> int:
    """Tokens of ``text``'s kv-embedding prompt by the oracle's own tokenizer (cut to its max_length)."""
    return len(oracle.tokenize(METHOD, text, kind).ids)


def test_which_configs_have_a_window():
    """As transformers masks them: Gemma 3 and Mistral slide; Qwen2 only with use_sliding_window
    and layers from max_window_layers on; Llama never; config.json dicts read alike."""
    assert sliding_window(Gemma3TextConfig(sliding_window=512)) == 512
    assert sliding_window(MistralConfig(sliding_window=4096)) == 4096
    assert sliding_window(MistralConfig(sliding_window=None)) is None
    assert sliding_window(Qwen2Config(sliding_window=4096)) is None  # use_sliding_window is off
    assert sliding_window(Qwen2Config(use_sliding_window=True, sliding_window=64, num_hidden_layers=4, max_window_layers=2)) == 64
    assert sliding_window(Qwen2Config(use_sliding_window=True, sliding_window=64, num_hidden_layers=4, max_window_layers=4)) is None
    assert sliding_window({"model_type": "qwen2", "sliding_window": 32768, "use_sliding_window": False}) is None
    assert sliding_window({"model_type": "mistral", "sliding_window": 4096}) == 4096
    assert sliding_window({"model_type": "gemma3_text", "sliding_window": 512, "layer_types": ["full_attention"]}) is None
    assert sliding_window(LlamaConfig()) is None


def test_a_model_without_a_window_gets_the_same_gate(stories_artifact, oracle):
    """The demo model (Llama, no window): the very texts, batches and padded tokens of the gate as
    before; its artifact records no window, and the gate's longest input as the oracle counts it."""
    embedder = load_embedder("stories260k", METHOD)
    texts = model_gate_texts(embedder)
    assert texts == GATE_TEXTS and gate_batches(texts) == gate_batches(GATE_TEXTS)
    assert gate_tokens(embedder.encoder, texts) == gate_tokens(embedder.encoder, GATE_TEXTS)
    manifest = read_manifest(stories_artifact(METHOD))
    assert manifest["source"]["sliding_window"] is None
    parity = manifest["parity"]
    assert parity["texts"] == len(GATE_TEXTS) and parity["rows"] == sum(len(batch.rows) for batch in gate_batches(GATE_TEXTS))
    demo = oracle("stories260k")
    longest = max(oracle_length(demo, GATE_TEXTS[n], kind) for batch in gate_batches(GATE_TEXTS) for kind, n in batch.rows)
    assert parity["longest_tokens"] == longest


def test_the_tiny_gemma3_gate_runs_one_text_past_its_window(tmp_path):
    """tests/test_gemma3.py's tiny Gemma 3 (a window of a few tokens): the gate gets one more text,
    a document whose prompt passes the window by the margin, by the oracle's count."""
    folder = build_tiny_gemma3(tmp_path / "gemma3", seed=5)
    texts = model_gate_texts(load_embedder(str(folder), METHOD))
    assert set(texts) - set(GATE_TEXTS) == {NAME} and all(texts[n] == GATE_TEXTS[n] for n in GATE_TEXTS)
    tokens = oracle_length(Oracle(folder), texts[NAME], "document")
    assert WINDOW + WINDOW_MARGIN // 2 < tokens <= WINDOW + WINDOW_MARGIN  # cut after a word
    assert [batch.rows for batch in gate_batches(texts) if NAME in batch.names] == [(("document", NAME),)]


# -- a window longer than every other gated text --------------------------------------------------


def limit_length(folder: Path, tokens: int) -> Path:
    """Let ``folder``'s model take inputs of ``tokens`` (its positions and its tokenizer's declared
    limit, the demo tokenizer's being shorter than the gate's longest text)."""
    for name, key in (("config.json", "max_position_embeddings"), ("tokenizer_config.json", "model_max_length")):
        data = json.loads((folder / name).read_text())
        data[key] = tokens
        (folder / name).write_text(json.dumps(data))
    return folder


@pytest.fixture(scope="module")
def long_window(tmp_path_factory):
    """A tiny Gemma 3 whose window is longer than every text of the old gate (by the oracle's count,
    queries and documents) and shorter than its max_length; and the same weights with a window
    past max_length: a model that computes as if there were no window."""
    root = tmp_path_factory.mktemp("long-window")
    probe = Oracle(limit_length(build_tiny_gemma3(root / "probe", seed=5), 4096))  # cuts nothing
    longest = max(oracle_length(probe, text, kind) for text in GATE_TEXTS.values() for kind in ("query", "document"))
    window = longest + 16
    max_length = window + 2 * WINDOW_MARGIN
    folder = limit_length(build_tiny_gemma3(root / "windowed", seed=9, sliding_window=window), max_length)
    unwindowed = root / "unwindowed"
    shutil.copytree(folder, unwindowed)
    config = json.loads((unwindowed / "config.json").read_text())
    config["sliding_window"] = 2 * max_length
    (unwindowed / "config.json").write_text(json.dumps(config))
    return folder, unwindowed, window, longest


@pytest.fixture(scope="module")
def long_window_export(long_window, tmp_path_factory):
    folder, _, _, _ = long_window
    with Exporter(load_embedder(str(folder), METHOD)) as exporter:
        result = exporter.write(tmp_path_factory.mktemp("exported") / "windowed", "fp32")
        yield exporter, result


def test_the_gate_covers_the_window_and_records_its_longest_input(long_window, long_window_export):
    """The export passes with one more row, the window text's; the manifest records the window and
    the longest input, the window text's length by the oracle, past the window."""
    folder, _, window, longest = long_window
    exporter, result = long_window_export
    text = exporter.gate_texts[NAME]
    tokens = oracle_length(Oracle(folder), text, "document")
    assert window < tokens <= window + WINDOW_MARGIN and longest < window
    parity = result.manifest.raw["parity"]
    assert result.manifest.raw["source"]["sliding_window"] == window
    assert parity["passed"] and parity["longest_tokens"] == tokens
    assert parity["texts"] == len(GATE_TEXTS) + 1
    assert parity["rows"] == sum(len(batch.rows) for batch in gate_batches(GATE_TEXTS)) + 1


def test_a_graph_that_ignores_the_window_is_refused(long_window, long_window_export, tmp_path):
    """Against a reference that differs from the graph only past the window (the same weights, no
    window), the old gate's texts pass and the gate refuses on the window text; nothing is written."""
    _, unwindowed, _, _ = long_window
    exporter, result = long_window_export
    wrong = load_embedder(str(unwindowed), METHOD)
    encoder = encoder_from_manifest(result.path, result.manifest)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inside = run_parity(gate_session(CPU, result.path / "model.onnx"), encoder, wrong, "fp32", texts=GATE_TEXTS)
    assert inside.passed and inside.worst_cosine >= 0.99999
    out = tmp_path / "refused"
    with pytest.raises(ParityError) as info:
        exporter.write(out, "fp32", reference=wrong)
    report = info.value.report
    assert not report.passed and report.worst_row["text"] == NAME and report.worst_cosine < 0.99999
    assert not out.exists()


def test_verify_reruns_the_window_text(long_window_export):
    _, result = long_window_export
    checked = verify(result.path)
    assert checked.passed and checked.report.longest_tokens == result.manifest.raw["parity"]["longest_tokens"]
    assert checked.report.rows == result.manifest.raw["parity"]["rows"]


def test_gate_work_counts_the_window_text(long_window_export):
    """benchmarks/export_memory.py's estimate of the gate's padded tokens: the window text's row
    (alone in its batch: it pads nothing else) on top of the old gate's."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from export_memory import gate_work

    from kvembed.export.gate.parity import HELD_OUT_TEXTS

    _, result = long_window_export
    encoder = encoder_from_manifest(result.path, result.manifest)
    old = gate_tokens(encoder, GATE_TEXTS) + gate_tokens(encoder, HELD_OUT_TEXTS)
    assert gate_work(result.path)["gate_tokens_per_side"] == old + result.manifest.raw["parity"]["longest_tokens"]
