"""``kvembed bench``: real exports, real onnxruntime and torch processes; timings are never asserted.

What is checked is that the numbers are *consistent* (percentiles ordered, throughput derived
from the samples, FLOPs from the model's shape), that both backends ran on identical inputs
(runtime fp32 matches torch), that the inputs have the token lengths asked for, and that the
reports exist and are valid.
"""

from __future__ import annotations

import json

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from checks import run_without_torch
from conftest import TEXTS
from kvembed.bench.measure import Timing, cosine_rows, default_subjects, peak_rss_mb, time_calls
from kvembed.artifact.external_data import load_with_weights
from kvembed.bench.peak import ModelShape, fp32_matmul_weights, gemm_peak, matmul_params, weight_gemms_call
from kvembed.bench.workload import exact_rows, make_batch, mixed_corpus
from kvembed.cli.main import app

pytestmark = pytest.mark.usefixtures("one_torch_thread")

runner = CliRunner()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: openvino joins the default backends where the package is installed; its precision is ARTIFACT/HINT
HAS_OPENVINO = "openvino" in default_subjects()
OPENVINO_PRECISION = None
if HAS_OPENVINO:
    from kvembed.backends.openvino import default_precision, import_openvino

    OPENVINO_PRECISION = "fp32/" + default_precision(import_openvino().Core())
QUICK_CELLS = {("runtime", "fp32"), ("runtime", "int8"), ("torch", "fp32")} | (
    {("openvino", OPENVINO_PRECISION)} if HAS_OPENVINO else set()
)
#: the bar of each row against torch: fp32 (and OpenVINO at f32) "the same", bf16 0.999, int8 0.99
COSINE_BARS = {"fp32": 0.99999, "fp32/f32": 0.99999, "fp32/bf16": 0.999}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """``kvembed bench --quick`` on the demo model: exports fp32 and int8, measures 12 cells.

    One thread: torch's OpenMP barriers stall erratically on small shared VMs with two (hundreds
    of ms per call), which would only make the test slow; the threads option is checked below.
    """
    out = tmp_path_factory.mktemp("bench") / "quick"
    result = runner.invoke(app, ["bench", "--quick", "--profile", "--threads", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, result.output, json.loads((out / "results.json").read_text())


def test_quick_run_reports_every_cell_consistently(quick_run):
    out, output, results = quick_run
    cells = results["cells"]
    assert {(c["backend"], c["precision"]) for c in cells} == QUICK_CELLS
    assert len(cells) == len(QUICK_CELLS) * 2 * 2  # batch 1,4 x seq 64,128
    assert {(c["batch_size"], c["seq_len"]) for c in cells} == {(1, 64), (4, 64), (1, 128), (4, 128)}
    shape = results["model"]
    peak = results["peak"]["gflops"]
    assert peak > 0 and shape["matmul_params"] > 0 and shape["layers_run"] == 5
    # a weight-only int8 graph runs float32 arithmetic on dequantised weights (its DequantizeLinear nodes)
    weight_only = any(n.op_type == "DequantizeLinear" for n in onnx.load(str(Path(results["artifacts"]["int8"]) / "model.onnx"),
                                                                         load_external_data=False).graph.node)
    for cell in cells:
        samples = np.array(cell["samples_s"])
        mean = samples.mean()
        assert cell["repeats"] == len(samples) >= 5
        assert 0 < cell["p50_ms"] <= cell["p95_ms"] <= cell["p99_ms"] <= samples.max() * 1e3 + 1e-9
        assert cell["mean_ms"] == pytest.approx(mean * 1e3)
        # throughput is total work over total time, and tokens/s counts real tokens only
        assert cell["texts_per_s"] == pytest.approx(cell["batch_size"] / mean)
        assert cell["tokens_per_s"] == pytest.approx(cell["texts_per_s"] * cell["tokens_per_row"])
        # the quick lengths are reachable for kv-embedding: every row has exactly seq_len tokens
        assert cell["exact_length"] and cell["real_tokens"] == cell["batch_size"] * cell["seq_len"]
        assert cell["padded_width"] == cell["seq_len"]
        n = cell["seq_len"]
        flops = cell["batch_size"] * (2 * shape["matmul_params"] * n + 4 * shape["attention_width"] * n * n * shape["layers_run"])
        assert cell["flops_per_batch"] == pytest.approx(flops)
        assert cell["gflops"] == pytest.approx(flops / mean / 1e9)
        assert cell["pct_of_peak"] == pytest.approx(100 * cell["gflops"] / results["peaks"][cell["peak_of"]]["gflops"])
        if cell["backend"] == "openvino":  # precision ARTIFACT/HINT: OpenVINO's own probe of that hint
            assert cell["peak_of"] == ("openvino bf16" if cell["precision"].endswith("bf16") else "openvino f32")
        else:
            integer = cell["precision"] == "int8" and cell["backend"] != "torch" and not weight_only
            assert cell["peak_of"] == ("onnxruntime int8" if integer else "onnxruntime fp32")
        assert cell["peak_rss_mb"] > 0
    torch = {(c["batch_size"], c["seq_len"]): c for c in cells if c["backend"] == "torch"}
    assert results["setup"]["baseline"] == "torch fp32"  # the PyTorch reference, where it was timed
    for cell in cells:
        if cell["backend"] == "torch":
            assert cell["baseline"] is None and cell["cosine_vs_baseline"] is None and cell["speedup_vs_baseline"] is None
            continue
        reference = torch[(cell["batch_size"], cell["seq_len"])]
        assert cell["baseline"] == "torch fp32"
        assert cell["speedup_vs_baseline"] == pytest.approx(reference["p50_ms"] / cell["p50_ms"])
        assert cell["cosine_vs_baseline"] >= COSINE_BARS.get(cell["precision"], 0.99), cell["precision"]
    # each backend/precision ran in its own process: torch's holds torch, the runtime's does not
    processes = {p["label"]: p for p in results["processes"]}
    assert set(processes) == {"runtime fp32", "runtime int8", "torch fp32"} | ({"openvino fp32"} if HAS_OPENVINO else set())
    assert processes["torch fp32"]["peak_rss_mb"] > processes["runtime fp32"]["peak_rss_mb"]
    assert processes["torch fp32"]["torch_loaded"]
    assert not any(p["torch_loaded"] for label, p in processes.items() if label != "torch fp32")
    assert results["setup"]["exported"] and results["setup"]["torch_precision"] == "fp32"
    assert set(results["artifacts"]) == {"fp32", "int8"}
    assert results["machine"]["threads"] == results["setup"]["threads"] == results["peak"]["threads"] == 1
    assert results["machine"]["cpu"]


def main_table(markdown: str) -> str:
    """results.md's table of cells: from its header to the blank line after it (the sections
    below, a profile's, have tables of their own)."""
    start = markdown.index("\n| backend | precision | batch | seq | tokens/row |")
    return markdown[start:markdown.index("\n\n", start)]


def test_quick_run_writes_markdown_and_png_plots(quick_run):
    out, output, results = quick_run
    for name in ("latency_vs_batch.png", "cost_vs_seqlen.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000
    markdown = (out / "results.md").read_text()
    header = "| backend | precision | batch | seq | tokens/row | p50 ms | p95 ms | p99 ms | texts/s | tokens/s |"
    assert header in markdown
    table = main_table(markdown)
    assert table.count("\n| runtime |") == 8 and table.count("\n| torch |") == 4
    assert table.count("\n| openvino |") == (4 if HAS_OPENVINO else 0)
    # the console gets the same cells as stacked tables of at most 80 columns (a pipe's width)
    assert "kvembed bench (continued)" in output and "results.json" in output and "latency_vs_batch.png" in output
    assert max(len(line) for line in output.splitlines() if "┃" in line or "│" in line) <= 80
    for precision in ("fp32", "int8"):
        assert (out / "artifacts" / precision / "kvembed.json").is_file()


def test_every_cell_reports_its_cv_and_noisy_flag(quick_run):
    """README: cells whose repeats vary by more than 25% (coefficient of variation) are flagged
    noisy in results.json, in results.md's ``cv`` column and note, and on their speedups. The cv
    is recomputed here with numpy from the cell's own samples_s."""
    out, output, results = quick_run
    cells = results["cells"]
    lines = main_table((out / "results.md").read_text()).splitlines()
    header = next(line for line in lines if line.startswith("| backend |"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert "cv" in columns, header
    rows = {}
    for line in lines:
        if line.startswith(("| runtime |", "| torch |", "| openvino |")):
            row = dict(zip(columns, (c.strip() for c in line.strip("|").split("|"))))
            rows[(row["backend"], row["precision"], int(row["batch"]), int(row["seq"]))] = row
    assert len(rows) == len(cells)
    for cell in cells:
        samples = np.array(cell["samples_s"])
        cv = float(samples.std() / samples.mean())  # population std, as "coefficient of variation"
        assert cell["cv"] == pytest.approx(cv, rel=1e-9, abs=1e-12)
        assert cell["noisy"] is (cv > 0.25)
        shown = rows[(cell["backend"], cell["precision"], cell["batch_size"], cell["seq_len"])]["cv"]
        number, _, flag = shown.partition("%")  # "12%" or "31% noisy"
        assert number.isdigit() and abs(int(number) - 100 * cv) <= 0.5 + 1e-9, shown
        assert (flag.strip() == "noisy") == (cv > 0.25), shown
    torch_noisy = {(c["batch_size"], c["seq_len"]): c["noisy"] for c in cells if c["backend"] == "torch"}
    for cell in cells:
        if cell["backend"] != "torch":
            assert cell["speedup_noisy"] == (cell["noisy"] or torch_noisy[(cell["batch_size"], cell["seq_len"])])
    noisy = sum(cell["noisy"] for cell in cells)
    note = f"{noisy} of {len(cells)} cells are noisy"
    assert (note in (out / "results.md").read_text()) == (noisy > 0)  # in the notes below the table


def test_profile_breaks_the_largest_cell_down_by_operator(quick_run):
    out, output, results = quick_run
    assert set(results["profile"]) == {"fp32", "int8"}
    for precision, profile in results["profile"].items():
        assert profile["cell"] == "b4-s128"
        ops = {op["op"]: op for op in profile["ops"]}
        assert abs(sum(op["share"] for op in profile["ops"]) - 1) < 1e-6
        assert abs(sum(op["ms_per_run"] for op in profile["ops"]) - profile["kernel_ms_per_run"]) < 1e-3
        # the session's graph after load-time fusion: RMSNorm fused, int8 matmuls quantized
        assert ops["SimplifiedLayerNormalization"]["nodes"] == 2 * results["model"]["layers_run"] + 1
        # (weight-only int8 fuses into MatMulNBits, dynamic int8 into the integer MatMul kernels)
        assert bool({"MatMulNBits", "MatMulIntegerToFloat", "DynamicQuantizeMatMul"} & set(ops)) == (precision == "int8")
    assert "## Where the time goes: runtime fp32, b4-s128" in (out / "results.md").read_text()
    # and every cell against the fp32 graph's weight GEMMs alone at its padded tokens: one figure per batch
    floors: dict[tuple[int, int], set[float]] = {}
    for cell in results["cells"]:
        assert cell["weight_gemms_ms"] > 0
        floors.setdefault((cell["batch_size"], cell["seq_len"]), set()).add(cell["weight_gemms_ms"])
        if (cell["backend"], cell["precision"]) == ("runtime", "fp32"):  # the whole graph runs those GEMMs and more
            assert cell["weight_gemms_ms"] < 2 * cell["p50_ms"], cell
    assert all(len(values) == 1 for values in floors.values()), floors
    assert "## Against the fp32 weight GEMMs alone (onnxruntime)" in (out / "results.md").read_text()


def test_workload_rows_have_exact_token_lengths(quick_run, oracle):
    """Re-tokenised by the oracle (tests/independent.py: the model folder's tokenizer.json and
    METHODS.md's prompt), rows have the lengths asked for."""
    from kvembed.runtime import Embedder

    assert quick_run[2]["setup"]["method"] == "kv-embedding"
    reference = oracle("stories260k")

    def lengths(texts) -> list[int]:
        return [len(reference.tokenize("kv-embedding", text, "document").ids) for text in texts]

    encoder = Embedder.load(quick_run[0] / "artifacts" / "fp32", provider="cpu", threads=1).encoder
    for seq_len in (47, 64, 100, 200, 512):
        rows = exact_rows(encoder, seq_len, 5)
        assert rows.exact and (seq_len < 64 or len(set(rows.texts)) == 5)  # different texts, same length
        assert lengths(rows.texts) == [seq_len] * 5
        batch = make_batch(encoder, rows, 3)
        assert batch.inputs["input_ids"].shape == (3, seq_len)
        assert int(batch.inputs["attention_mask"].sum()) == batch.real_tokens == 3 * seq_len
    assert exact_rows(encoder, 100, 2).texts == exact_rows(encoder, 100, 2).texts  # deterministic
    short = exact_rows(encoder, 10, 2)  # shorter than the prompt alone: recorded, not hidden
    assert not short.exact and short.lengths[0] > 10 and short.texts[0] == ""
    corpus = mixed_corpus(encoder, 40, 50, 300, seed=3)
    assert corpus.texts == mixed_corpus(encoder, 40, 50, 300, seed=3).texts
    assert all(50 <= n <= 300 for n in corpus.targets) and len(set(corpus.targets)) > 10
    assert lengths(corpus.texts) == list(corpus.lengths)
    assert sum(a == b for a, b in zip(corpus.lengths, corpus.targets)) >= 38


def test_workload_pads_the_pool_mask_for_echo():
    from tokenizers import Tokenizer

    from kvembed.methods import demo_model_path, resolve
    from kvembed.runtime.encoding import TextEncoder

    tokenizer = Tokenizer.from_file(str(demo_model_path() / "tokenizer.json"))
    encoder = TextEncoder(tokenizer, resolve("echo", 5, "stories260k"), 512, fallback_id=2, pad_id=0)
    rows = exact_rows(encoder, 101, 2)  # echo repeats the text: lengths move in steps of 2
    assert all(99 <= n <= 101 for n in rows.lengths)
    batch = make_batch(encoder, rows, 2)
    assert set(batch.inputs) == {"input_ids", "attention_mask", "pool_mask"}
    assert batch.inputs["pool_mask"].sum() > 0


def test_artifact_is_reused_not_reexported(quick_run, tmp_path):
    artifact = quick_run[0] / "artifacts" / "int8"
    before = {p.name: p.stat().st_mtime_ns for p in artifact.iterdir()}
    out = tmp_path / "reuse"
    args = ["bench", "--quick", "--threads", "1", "--artifact", str(artifact), "--batch-sizes", "2", "--seq-lens", "80",
            "--warmup", "0", "--min-repeats", "2", "--min-seconds", "0", "--max-repeats", "3", "--out", str(out),
            "--backends", "runtime,torch"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "trace" not in result.output and "export" not in result.output
    results = json.loads((out / "results.json").read_text())
    assert not results["setup"]["exported"] and not (out / "artifacts").exists()
    assert results["artifacts"] == {"int8": str(artifact)}
    assert {(c["backend"], c["precision"]) for c in results["cells"]} == {("runtime", "int8"), ("torch", "fp32")}
    runtime = next(c for c in results["cells"] if c["backend"] == "runtime")
    assert runtime["cosine_vs_baseline"] >= 0.99 and 2 <= runtime["repeats"] <= 3
    assert {p.name: p.stat().st_mtime_ns for p in artifact.iterdir()} == before


def test_rounds_run_every_backend_in_turn_and_the_speedup_is_the_median_of_the_rounds_ratios(quick_run, tmp_path):
    """Three rounds of two backends: six processes in turn, each cell holding every round's samples
    and each round's median, and the speedup the median of the three same-round ratios."""
    artifact = quick_run[0] / "artifacts" / "fp32"
    out = tmp_path / "rounds"
    args = ["bench", "--threads", "1", "--artifact", str(artifact), "--batch-sizes", "2", "--seq-lens", "64", "--warmup", "0",
            "--min-repeats", "3", "--max-repeats", "3", "--min-seconds", "0", "--rounds", "3", "--backends", "runtime,torch",
            "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "runtime fp32 (round 3/3)" in result.output
    results = json.loads((out / "results.json").read_text())
    assert results["setup"]["rounds"] == 3
    assert [len(p["load_seconds_rounds"]) for p in results["processes"]] == [3, 3]
    cells = {c["backend"]: c for c in results["cells"]}
    for cell in cells.values():
        samples = np.array(cell["samples_s"])
        assert cell["repeats"] == len(samples) == 9
        want = [1e3 * float(np.median(samples[i:i + 3])) for i in (0, 3, 6)]
        assert cell["rounds_p50_ms"] == pytest.approx(want)
    ratios = [t / r for t, r in zip(cells["torch"]["rounds_p50_ms"], cells["runtime"]["rounds_p50_ms"])]
    assert cells["runtime"]["speedup_vs_baseline"] == pytest.approx(sorted(ratios)[1])


def test_runtime_only_benchmark_never_imports_torch(quick_run, tmp_path):
    artifact = quick_run[0] / "artifacts" / "fp32"
    done = run_without_torch(f"""
        from kvembed.bench import BenchConfig, run_bench
        results = run_bench(BenchConfig(out={str(tmp_path / 'rt')!r}, artifact={str(artifact)!r},
            backends=("runtime",), batch_sizes=(1,), seq_lens=(64,), warmup=0, min_repeats=1,
            min_seconds=0.0, max_repeats=2, gemm_size=128))
        assert [c["backend"] for c in results["cells"]] == ["runtime"]
        assert results["setup"]["baseline"] == "runtime fp32" and results["cells"][0]["cosine_vs_baseline"] is None
        assert not results["processes"][0]["torch_loaded"]  # nor in the measuring process
    """, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--batch-sizes", "0,x"], "--batch-sizes: '0' is not a positive integer"),
        (["--batch-sizes", "4,x"], "--batch-sizes: 'x' is not a positive integer"),
        (["--seq-lens", ""], "--seq-lens: give a comma-separated list"),
        (["--precision", "fp8"], "--precision: unknown value 'fp8'"),
        (["--backends", "tensorflow"], "--backends: unknown value 'tensorflow'"),
        (["--method", "nope"], "unknown method 'nope'"),
        (["--model", "./no/such/model"], "no model folder at './no/such/model'"),
        (["--threads", "0"], "--threads must be >= 1"),
        (["--rounds", "0"], "--rounds must be a positive integer, got 0"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, message, tmp_path):
    result = runner.invoke(app, ["bench", "--quick", "--out", str(tmp_path / "out"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_bad_out_and_artifact_misuse_exit_2(quick_run, tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    result = runner.invoke(app, ["bench", "--quick", "--out", str(busy)])
    assert result.exit_code == 2 and "not empty; use --force" in result.output
    assert (busy / "keep.txt").read_text() == "mine"
    artifact = str(quick_run[0] / "artifacts" / "fp32")
    result = runner.invoke(app, ["bench", "--artifact", artifact, "--seq-lens", "1024", "--out", str(tmp_path / "a")])
    assert result.exit_code == 2 and "1024 is longer than the artifact's max_length (512)" in result.output
    result = runner.invoke(app, ["bench", "--artifact", artifact, "--method", "va", "--out", str(tmp_path / "b")])
    assert result.exit_code == 2 and "an artifact fixes its model, method and options" in result.output
    result = runner.invoke(app, ["bench", "--artifact", artifact, "--precision", "int8", "--out", str(tmp_path / "c")])
    assert result.exit_code == 2 and "the artifact is fp32" in result.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_time_calls_honours_warmup_repeats_and_seconds():
    calls = []
    ticks = iter(range(10**6))
    clock = lambda: float(next(ticks))  # every clock read advances one "second"  # noqa: E731
    samples = time_calls(lambda: calls.append(1), warmup=3, min_repeats=4, min_seconds=0, clock=clock)
    assert len(calls) == 3 + 4 and samples == [1.0] * 4
    calls.clear()
    samples = time_calls(lambda: calls.append(1), warmup=0, min_repeats=2, min_seconds=10, clock=clock)
    assert len(samples) == 10  # the time floor, not the count, ended it
    samples = time_calls(lambda: None, warmup=0, min_repeats=2, min_seconds=1e9, max_repeats=7, clock=clock)
    assert len(samples) == 7  # capped
    with pytest.raises(ValueError, match="max_repeats"):
        time_calls(lambda: None, min_repeats=5, max_repeats=2)
    timing = Timing((0.001, 0.002, 0.003, 0.010), batch_size=4, real_tokens=256)
    assert timing.p50_ms <= timing.p95_ms <= timing.p99_ms <= 10.0 + 1e-9
    assert timing.texts_per_s == pytest.approx(4 / 0.004) and timing.tokens_per_s == pytest.approx(256 / 0.004)


def test_flop_count_and_gemm_peak():
    shape = ModelShape(matmul_params=1000, layers_run=3, attention_width=8, hidden_size=8)
    # linear 2*1000*(10+20); attention full square 4*8*(10^2 + 20^2) per layer, 3 layers
    assert shape.flops([10, 20]) == 2 * 1000 * 30 + 4 * 8 * (100 + 400) * 3
    peak = gemm_peak(1, size=128, repeats=2, warmup=1)
    assert peak["gflops"] > 0 and peak["size"] == 128 and peak["threads"] == 1 and peak["probe"] == "onnxruntime fp32"
    # a larger side also tries the smaller squares (a large one's operands can outgrow the caches): the best is the peak
    wide = gemm_peak(1, size=600, repeats=1, warmup=0)
    assert set(wide["tried"]) == {"512", "600"} and wide["gflops"] == max(wide["tried"].values())
    assert wide["size"] == int(max(wide["tried"], key=wide["tried"].__getitem__))
    probes = ["onnxruntime int8", *(["openvino bf16", "openvino f32"] if HAS_OPENVINO else [])]
    for probe in probes:  # each library's own kernel at its own arithmetic
        measured = gemm_peak(1, size=128, repeats=2, warmup=1, probe=probe)
        assert measured["gflops"] > 0 and measured["probe"] == probe and "128x128" in measured["how"]
    with pytest.raises(ValueError, match="unknown GEMM probe 'fp8'"):
        gemm_peak(1, size=128, probe="fp8")
    a = np.array([[1.0, 0.0], [1.0, 1.0]])
    assert cosine_rows(a, a * 3) == pytest.approx([1.0, 1.0])


def _graph_with_weights(path, nodes, initializers):
    """Save an ONNX graph of ``nodes`` with ``initializers`` (only read, never run)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, None) for n in nodes],
        [numpy_helper.from_array(a, name) for name, a in initializers.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def test_weights_with_a_hard_linked_data_file_are_read(tmp_path):
    """``kvembed triton build`` and ``kvembed bundle`` hard-link an artifact's ``model.onnx.data``;
    onnx refuses such a file, kvembed's readers (this weight reader, the ONNX reference evaluator's
    loader) read it."""
    import onnx
    from onnx import helper

    rng = np.random.default_rng(5)
    w1 = rng.standard_normal((8, 64), dtype=np.float32)
    w2 = rng.standard_normal((64, 32), dtype=np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])]
    inline = _graph_with_weights(tmp_path / "inline.onnx", nodes, {"w1": w1, "w2": w2})
    folder = tmp_path / "artifact"
    folder.mkdir()
    onnx.save(onnx.load(str(inline)), str(folder / "model.onnx"), save_as_external_data=True,
              location="model.onnx.data", size_threshold=0)
    os.link(folder / "model.onnx.data", tmp_path / "linked.data")
    with pytest.raises(Exception, match="hard link"):
        onnx.load(str(folder / "model.onnx"))
    for got, want in zip(fp32_matmul_weights(folder / "model.onnx"), (w1, w2)):
        np.testing.assert_array_equal(got, want)
    model = load_with_weights(folder / "model.onnx")
    assert {t.name: onnx.numpy_helper.to_array(t).tolist() for t in model.graph.initializer} == \
        {"w1": w1.tolist(), "w2": w2.tolist()}


def test_weight_gemms_call_runs_every_fp32_matmul_weight_once_per_use(tmp_path):
    from onnx import helper

    rng = np.random.default_rng(3)
    w1 = rng.standard_normal((8, 4), dtype=np.float32)
    w2 = rng.standard_normal((4, 6), dtype=np.float32)
    q = rng.integers(-5, 5, (8, 5), dtype=np.int8)
    bias = rng.standard_normal((8, 3), dtype=np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["a"]),
        helper.make_node("MatMul", ["h", "w2"], ["b"]),  # one weight used twice: counted twice
        helper.make_node("MatMul", ["x", "x_t"], ["c"]),  # activation @ activation: not a weight
        helper.make_node("MatMulInteger", ["xq", "q"], ["d"]),  # int8: not an fp32 weight
        helper.make_node("Gemm", ["x", "bias"], ["e"]),
    ]
    path = _graph_with_weights(tmp_path / "m.onnx", nodes, {"w1": w1, "w2": w2, "q": q, "bias": bias})
    weights = fp32_matmul_weights(path)
    assert len(weights) == 3
    for got, want in zip(weights, (w1, w2, w2)):
        np.testing.assert_array_equal(got, want)
    # every 2-D weight of a MatMul-like node counts for the FLOP model, int8 and Gemm included
    assert matmul_params(path) == w1.size + 2 * w2.size + q.size + bias.size
    call, flops = weight_gemms_call(path, tokens=5, threads=1)
    assert [o.shape for o in call()] == [(5, 4), (5, 6), (5, 6)]
    assert flops == 2 * 5 * (8 * 4 + 4 * 6 + 4 * 6)

    int8_only = _graph_with_weights(tmp_path / "q.onnx", [nodes[4]], {"q": q})
    with pytest.raises(ValueError, match="no fp32 MatMul weights"):
        weight_gemms_call(int8_only, tokens=5, threads=1)
    # weight-only int8: the int8 weight reaches the MatMul through a DequantizeLinear
    scale = np.float32(0.1)
    dequantized = [helper.make_node("DequantizeLinear", ["q", "scale"], ["qf"]), helper.make_node("MatMul", ["x", "qf"], ["f"])]
    weight_only = _graph_with_weights(tmp_path / "w.onnx", dequantized, {"q": q, "scale": np.array(scale)})
    assert matmul_params(weight_only) == q.size
    with pytest.raises(ValueError, match="rows must be >= 1"):
        weight_gemms_call(path, tokens=0, threads=1)


def test_build_random_model_is_a_loadable_qwen3(tmp_path):
    from kvembed.bench.synthetic import build_random_model
    from kvembed.export.core import load_embedder

    folder = build_random_model(tmp_path / "q", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["num_hidden_layers"] == 2 and config["head_dim"] == 16
    from tokenizers import Tokenizer

    tokens = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size()
    assert config["vocab_size"] == tokens and config["max_position_embeddings"] >= 2048
    assert any(folder.glob("*.safetensors"))
    embedder = load_embedder(str(folder), "kv-embedding")
    assert embedder.max_length >= 2048  # the copied tokenizer's 512 limit was lifted
    vectors = embedder.encode(["a short text", "another, somewhat longer, text " * 40])
    assert vectors.shape == (2, 64) and np.isfinite(vectors).all()
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        build_random_model(tmp_path / "bad", layers=1, hidden=64, heads=3, kv_heads=2, head_dim=16, ffn=64)


def test_interleaved_calls_take_turns_and_ratio_is_the_median_per_round():
    from kvembed.bench.measure import interleaved, ratio

    order: list[str] = []
    times = interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, rounds=3, warmup=1)
    assert order == ["a", "b"] + ["a", "b"] * 3  # warm-up of each, then strict turns
    assert len(times["a"]) == len(times["b"]) == 3
    assert ratio({"a": [2.0, 9.0, 3.0], "b": [1.0, 3.0, 1.0]}, "a", "b") == 3.0  # per round: 2, 3, 3


def test_interleaved_leaves_the_gap_idle_before_every_timed_call():
    import time

    from kvembed.bench.measure import interleaved

    ended: list[float] = []
    idle: list[float] = []

    def call() -> None:
        if ended:
            idle.append(time.perf_counter() - ended[-1])
        ended.append(time.perf_counter())

    interleaved({"a": call, "b": call}, rounds=2, warmup=0, gap=0.03)
    assert len(idle) == 3 and min(idle) >= 0.03
    with pytest.raises(ValueError, match="gap"):
        interleaved({"a": call}, rounds=1, gap=-1)


def test_raw_token_batch_has_exact_lengths_of_real_tokens(quick_run):
    from kvembed.bench.workload import raw_token_batch, word_stream
    from kvembed.runtime import Embedder

    embedder = Embedder.load(quick_run[0] / "artifacts" / "fp32", provider="cpu", threads=1)
    batch = raw_token_batch(embedder.encoder, 3, 32)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (3, 32)
    assert batch["attention_mask"].all() and len({tuple(r) for r in batch["input_ids"]}) == 3
    text = embedder.encoder.tokenizer.decode(batch["input_ids"][0].tolist())
    assert len(text) > 16 and word_stream(0, 256).startswith(text)  # the English word stream, cut at 32 tokens


def test_the_served_subject_embeds_each_row_as_its_own_request_as_the_oracle_does(stories_artifact, oracle):
    """``--backends served``: ``kvembed serve`` of the artifact, each row of the batch a concurrent
    request of token ids; the rows come back in order, as the independent oracle embeds each text."""
    from kvembed.bench.worker import CellInput, WorkerSpec, measure_cells
    from kvembed.runtime import Embedder

    artifact = stories_artifact("last-token")
    texts = ["hello there", "a longer text about cats and dogs and birds", "x", TEXTS[2]]
    encoder = Embedder.load(artifact, provider="cpu").encoder
    batch = encoder.pad(encoder.encode(texts, "document"), "left")  # left padding: the rows' ids are the unpadded ones
    events = []
    result = measure_cells(WorkerSpec("served", str(artifact), 1, [CellInput("cell", dict(batch))], min_repeats=2,
                                      min_seconds=0.0, max_repeats=2), lambda kind, payload: events.append(kind))
    got = result["cells"]["cell"]["output"]
    want = np.stack([oracle("stories260k").embed("last-token", text, "document") for text in texts])
    assert cosine_rows(got, want).min() >= 0.99999
    assert result["precision"] == "fp32/onnxruntime-cpu" and events == ["loaded", "cell"]
    # the server's peak, not this process's (which holds torch and the oracle, and ran the clients)
    assert 50 < result["peak_rss_mb"] < peak_rss_mb() - 100, (result["peak_rss_mb"], peak_rss_mb())


def test_the_served_subject_refuses_a_method_that_prompts_its_text_in_one_line(stories_artifact):
    from kvembed.bench.worker import CellInput, WorkerSpec, measure_cells
    from kvembed.errors import InvalidInput

    with pytest.raises(InvalidInput, match="backend served sends token ids, which only raw-text methods take .*"
                                           "kv-embedding prompts its text: time it with auto"):
        measure_cells(WorkerSpec("served", str(stories_artifact("kv-embedding")), 1, [CellInput("c", {})]), lambda *_: None)


def test_bench_refuses_served_for_a_prompting_method_before_it_measures(stories_artifact, tmp_path):
    result = runner.invoke(app, ["bench", "--artifact", str(stories_artifact("kv-embedding")), "--backends", "served",
                                 "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "--backends served: backend served sends token ids" in said and "time it with auto" in said, said
    assert not (tmp_path / "out").exists()


def test_end_to_end_cells_embed_their_texts_as_the_oracle_does(stories_artifact, oracle, tmp_path):
    """``end_to_end``: each call is ``Embedder.encode`` of the cell's texts with its kind's prompt
    (the query prompt here), as the independent oracle embeds each text; the report says so."""
    from kvembed.bench.worker import CellInput, WorkerSpec, measure_cells
    from kvembed.runtime import read_manifest

    artifact = stories_artifact("kv-embedding")
    texts = ("hello there", "a longer text about cats and dogs and birds", TEXTS[2])
    spec = WorkerSpec("runtime", str(artifact), 1, [CellInput("cell", {}, texts, "query")], min_repeats=2,
                      min_seconds=0.0, max_repeats=2, end_to_end=True)
    got = measure_cells(spec, lambda *_: None)["cells"]["cell"]["output"]
    options = dict(read_manifest(artifact)["method"]["options"])  # the defaults kvembed resolved, as the oracle takes them
    want = np.stack([oracle("stories260k").embed("kv-embedding", text, "query", **options) for text in texts])
    assert got.shape == want.shape and cosine_rows(got, want).min() >= 0.99999
    out = tmp_path / "e2e"
    result = runner.invoke(app, ["bench", "--artifact", str(artifact), "--end-to-end", "--backends", "runtime,auto",
                                 "--batch-sizes", "1,3", "--seq-lens", "64", "--threads", "1", "--warmup", "0",
                                 "--min-repeats", "2", "--max-repeats", "2", "--min-seconds", "0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert results["setup"]["end_to_end"] is True
    assert sorted((c["backend"], c["batch_size"]) for c in results["cells"]) == [("auto", 1), ("auto", 3), ("runtime", 1), ("runtime", 3)]
    report = (out / "results.md").read_text()
    assert "Embedder.encode of the cell's texts, end to end" in report and "tokenisation included" in report
    # no torch row: every other row is compared with onnxruntime fp32, its ratio and cosine from the same calls
    base = {c["batch_size"]: c for c in results["cells"] if c["backend"] == "runtime"}
    assert results["setup"]["baseline"] == "runtime fp32" and "`runtime fp32` (no torch row was timed" in report
    for cell in (c for c in results["cells"] if c["backend"] == "auto"):
        assert cell["baseline"] == "runtime fp32"
        assert cell["speedup_vs_baseline"] == pytest.approx(base[cell["batch_size"]]["p50_ms"] / cell["p50_ms"])
        assert cell["cosine_vs_baseline"] > 0.999  # what auto runs is fp32 or a certified precision of the same model
    assert all(c["baseline"] is None and c["speedup_vs_baseline"] is None for c in base.values())
    # each end-to-end cell's split by stage adds up to its call, the graph's share measured at the session
    for cell in results["cells"]:
        stages = cell["stages_ms"]
        assert stages["tokenizer"] > 0 and stages["graph"] > 0 and stages["around"] > 0, stages
        assert stages["tokenizer"] + stages["graph"] + stages["around"] == pytest.approx(stages["total"], rel=0.05)
    assert "## Where an end-to-end call's time goes" in report


def test_the_stage_split_times_the_embedders_own_calls_and_leaves_them_as_they_were(stories_artifact):
    from kvembed.bench.measure import RuntimeSubject

    with RuntimeSubject(stories_artifact("kv-embedding"), 1) as subject:
        texts = ["hello there", "a longer text about cats and dogs"]
        want = subject.encode(texts, "query")
        stages = subject.stages(texts, "query", 3)
        assert set(stages) == {"tokenizer", "graph", "around", "total"}
        assert "run" not in vars(subject.embedder.session) and "encode" not in vars(subject.embedder.encoder)
        np.testing.assert_array_equal(subject.encode(texts, "query"), want)


def test_end_to_end_without_backends_times_the_default_ones_that_run_in_process(tmp_path):
    from kvembed.bench import BenchConfig

    backends = BenchConfig.create(tmp_path, end_to_end=True).backends
    assert "runtime" in backends and "torch" not in backends and "served" not in backends
    assert "torch" in BenchConfig.create(tmp_path).backends  # without --end-to-end the reference is timed


def test_end_to_end_refuses_the_backends_that_have_no_encode_in_one_line(stories_artifact, tmp_path):
    result = runner.invoke(app, ["bench", "--artifact", str(stories_artifact("last-token")), "--end-to-end",
                                 "--backends", "runtime,torch,served", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "end_to_end times Embedder.encode, which only runtime, openvino, auto run in process; drop torch, served" in said, said
    assert not (tmp_path / "out").exists()
