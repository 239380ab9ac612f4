"""An fp16 artifact on OpenVINO at two bytes a weight (onnxruntime's CPU provider holds fp32 copies,
twice the memory): under the f16 hint as it is, on a CPU with FP16 (AVX-512 FP16, AMX-FP16), and
retyped to bf16 (``kvembed.backends.openvino.write_bf16_graph``) under the bf16 hint, on a CPU with BF16. The
export's advisory checks certify them at fp16's bar against PyTorch, the one this CPU runs fastest
first (AMX tiles before vector units), and ``provider="auto"`` then runs the artifact there.

The first load compiles and has OpenVINO stream the blob to the cache (``CACHE_DIR``) instead of
holding it in memory; later loads import the blob. Both are measured here by the kernel's VmHWM in
a child process, against the bytes of an fp16 weight chain built in the test.

Each hint runs only on a CPU that has it; the choice ``auto`` makes on another CPU is stated with
``KVEMBED_CPU_FEATURES`` and never run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import UNSEEN, unit

pytest.importorskip("openvino", reason="the f16 and bf16 hints are OpenVINO's (pip install 'kvembed[openvino]')")

from kvembed.artifact import Manifest, load_manifest  # noqa: E402
from kvembed.backends.catalogue import choose_backend  # noqa: E402
from kvembed.backends.cpu import cpu_features  # noqa: E402
from kvembed.errors import InvalidInput  # noqa: E402
from kvembed import OpenVINOOptions  # noqa: E402
from kvembed.runtime import Embedder  # noqa: E402

#: what OpenVINO's CPU plugin holds of its own beyond a model's weights, whatever their size
PLUGIN_OWN = 256 * 1024**2
#: a CPU with BF16 but no FP16 (Zen 4, Cooper Lake)
NO_FP16 = "avx2,avx512f,avx512_bf16"
#: one with both on vector units only
FP16_AND_BF16 = "avx2,avx512f,avx512_bf16,avx512_fp16"
#: Sapphire Rapids: bf16 on AMX tiles, fp16 on AVX-512 vectors only
AMX_BF16_ONLY = FP16_AND_BF16 + ",amx_tile,amx_bf16"
#: Granite Rapids: both on AMX tiles
AMX_BOTH = AMX_BF16_ONLY + ",amx_fp16"


def fastest_hint_here() -> str:
    """The hint an fp16 artifact should run with on this CPU, by the rule stated in the docs: bf16
    where AMX runs bf16 and not fp16 or where the CPU has no FP16, else f16 (the more precise)."""
    features = cpu_features()
    tiles_bf16_only = "amx_bf16" in features.flags and "amx_fp16" not in features.flags
    if not features.runs("f16") or (tiles_bf16_only and features.runs("bf16")):
        return "bf16"
    return "f16"


def needs(hint: str) -> None:
    if not cpu_features().runs(hint):
        pytest.skip(f"this CPU has {cpu_features().describe_hint(hint)}: OpenVINO would run the {hint} hint in f32")


@pytest.fixture(scope="module")
def fp16(stories_artifact):
    return stories_artifact("kv-embedding", "fp16")


def assert_close_to_oracle(embedder, oracle) -> None:
    stories = oracle("stories260k")
    for kind in ("document", "query"):
        want = unit(np.stack([stories.embed("kv-embedding", text, kind, layers="1-3") for text in UNSEEN]))
        got = embedder.encode(UNSEEN, kind=kind, batch_size=8)
        assert float((got * want).sum(-1).min()) >= 0.999
        # 2-byte arithmetic normalises to ~1e-4; the runtime gives unit rows all the same
        np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, atol=1e-6)


def test_the_export_certifies_the_alternative_this_cpu_runs_fastest_and_auto_takes_it(fp16, oracle):
    hint = fastest_hint_here()
    needs(hint)
    other = {"f16": "bf16", "bf16": "f16"}[hint]
    manifest = load_manifest(fp16)
    ov = manifest.certificate("openvino", {"f16": "fp16", "bf16": "bf16"}[hint], bar="fp16")
    assert ov is not None and ov.target == f"openvino-{hint}" and ov.raw["graph"] == "model.onnx"
    assert ov.min_cosine == 0.999 and 0.999 <= ov.worst_cosine <= 1.0
    advisory = manifest.parity.advisory
    assert advisory[f"openvino-{hint}"].report.worst_cosine == ov.worst_cosine
    assert advisory[f"openvino-{hint}"].held_out.backend == f"openvino-{hint}"
    # chosen because it passed, so held to the bar on text the choice never saw as well
    assert advisory[f"openvino-{hint}"].held_out.decides is True and list(ov.decided_by) == ["gate", "held_out"]
    assert ov.decided_by["held_out"]["worst_cosine"] >= 0.999
    assert advisory[f"openvino-{other}"].skipped == f"not needed: openvino-{hint} certified"
    assert load_manifest(fp16).raw["parity"]["advisory"][f"openvino-{other}"] == {"skipped": f"not needed: openvino-{hint} certified"}  # the first passed: no second pass
    fast = Embedder.load(fp16, options=OpenVINOOptions(cache_dir=False))
    assert fast.target == f"openvino-{hint}" and "fp16 artifact certified on OpenVINO" in fast.choice.reason
    assert_close_to_oracle(fast, oracle)


def test_the_advisory_alternatives_come_in_the_order_the_cpu_runs_them_fastest(monkeypatch):
    """The order alone (nothing runs): AMX tiles first, the more precise f16 where both run alike."""
    from kvembed.export.gate.certify import advisory_checks

    for stated, first in ((AMX_BF16_ONLY, "openvino-bf16"), (AMX_BOTH, "openvino-f16"), (FP16_AND_BF16, "openvino-f16"),
                          (NO_FP16, "openvino-bf16"), ("avx2", "openvino-f16")):
        monkeypatch.setenv("KVEMBED_CPU_FEATURES", stated)
        assert [target for target, _, _ in advisory_checks("fp16")][0] == first, stated
        assert {bar for _, bar, _ in advisory_checks("fp16")} == {"fp16"}
    # int8's groups are separate: bf16 always before f32 (a group each)
    monkeypatch.setenv("KVEMBED_CPU_FEATURES", "avx2")
    assert [(t, g) for t, _, g in advisory_checks("int8")] == [("openvino-bf16", 0), ("openvino-f32", 1)]


def test_without_fp16_the_bf16_check_certifies_the_artifact_retyped_and_auto_runs_it(fp16, oracle, tmp_path, monkeypatch):
    """Stated without FP16, ``kvembed verify --record`` runs the bf16 alternative (the f16 one cannot
    run), on this CPU's BF16, and records it; ``auto`` then runs the artifact on OpenVINO bf16."""
    needs("bf16")
    copy = shutil.copytree(fp16, tmp_path / "fp16")
    monkeypatch.setenv("KVEMBED_CPU_FEATURES", NO_FP16)
    from kvembed.cli.main import app
    from typer.testing import CliRunner

    done = CliRunner().invoke(app, ["verify", str(copy), "--backends", "openvino-bf16", "--record"])
    assert done.exit_code == 0, done.output
    ov = load_manifest(copy).certificate("openvino", "bf16", bar="fp16")
    assert ov is not None and ov.target == "openvino-bf16" and ov.hint == "bf16" and ov.raw["graph"] == "model.onnx"
    assert 0.999 <= ov.worst_cosine <= 1.0 and list(ov.decided_by) == ["gate", "held_out"]  # as at export
    fast = Embedder.load(copy, options=OpenVINOOptions(cache_dir=tmp_path / "cache"))
    assert fast.target == "openvino-bf16" and "fp16 artifact certified on OpenVINO (openvino-bf16" in fast.choice.reason
    assert_close_to_oracle(fast, oracle)
    assert len(list((tmp_path / "cache").glob("*.blob"))) == 1 and not list((tmp_path / "cache").glob(".compiling-*"))


def test_auto_takes_the_certified_hint_the_cpu_runs_fastest_and_says_why_it_takes_neither(fp16, tmp_path, monkeypatch):
    """The decision alone (nothing runs): an fp16 artifact certified both ways."""
    manifest = json.loads((fp16 / "kvembed.json").read_text())
    base = {"backend": "openvino", "against": "pytorch", "min_cosine": 0.999, "cpu": {}}
    manifest["certified"] = [c for c in manifest.get("certified", []) if c["backend"] != "openvino"] + [
        {**base, "target": "openvino-f16", "precision": "fp16", "hint": "fp16", "worst_cosine": 0.9995},
        {**base, "target": "openvino-bf16", "precision": "bf16", "hint": "bf16", "worst_cosine": 0.9993},
    ]
    for stated, backend, hint in ((FP16_AND_BF16, "openvino", "f16"), (AMX_BF16_ONLY, "openvino", "bf16"),
                                  (AMX_BOTH, "openvino", "f16"), (NO_FP16, "openvino", "bf16"), ("avx2", "onnxruntime", None)):
        monkeypatch.setenv("KVEMBED_CPU_FEATURES", stated)
        choice = choose_backend(fp16, manifest=Manifest.from_dict(manifest))
        assert (choice.backend, choice.ov_precision) == (backend, hint), (stated, choice)
    assert "this CPU has no FP16" in choice.reason and "twice the memory" in choice.reason
    manifest["certified"] = [c for c in manifest["certified"] if c["backend"] != "openvino"]
    choice = choose_backend(fp16, manifest=Manifest.from_dict(manifest))
    assert choice.backend == "onnxruntime" and "no certificate of OpenVINO running fp16 or bf16" in choice.reason


def test_without_fp16_or_bf16_auto_stays_on_onnxruntime_and_the_hints_run_f32(fp16, monkeypatch):
    monkeypatch.setenv("KVEMBED_CPU_FEATURES", "avx2,avx512f")
    stated = Embedder.load(fp16)
    assert stated.target == "onnxruntime-cpu" and "twice the memory" in stated.choice.reason
    for hint in ("f16", "bf16"):
        asked = Embedder.load(fp16, provider="openvino", options=OpenVINOOptions(precision=hint, cache_dir=False))
        assert asked.target == "openvino-f32"  # as OpenVINO itself runs these hints on such a CPU


CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np

    def status():
        fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
        return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}

    from kvembed.backends.openvino import OpenVINOSession
    import openvino  # noqa: F401  (its libraries are not the model's memory)
    x = np.load(sys.argv[3])
    before = status()["VmRSS"]
    session = OpenVINOSession(sys.argv[1], precision=sys.argv[5], cache_dir=sys.argv[2])
    y = session.run({"x": x}, ["y"])[0]
    y = session.run({"x": x}, ["y"])[0]
    np.save(sys.argv[4], y)
    print(json.dumps({"grew": status()["VmHWM"] - before, "from_cache": session.from_cache, "ran": session.precision}))
""")


def fp16_chain(path, layers: int = 16, width: int = 3072) -> list[np.ndarray]:
    """An ONNX graph of ``layers`` fp16 MatMuls of ``width`` squared (x cast to fp16 and back), its
    weights in external data as an fp16 artifact's are; returns the weights."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [(rng.standard_normal((width, width), dtype=np.float32) / np.sqrt(width)).astype(np.float16)
               for _ in range(layers)]
    nodes = [helper.make_node("Cast", ["x"], ["h0"], to=TensorProto.FLOAT16)]
    nodes += [helper.make_node("MatMul", [f"h{i}", f"w{i}"], [f"h{i + 1}"]) for i in range(layers)]
    nodes.append(helper.make_node("Cast", [f"h{layers}"], ["y"], to=TensorProto.FLOAT))
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", width])],
        [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)],
    )
    graph.value_info.append(helper.make_tensor_value_info("h1", TensorProto.FLOAT16, ["rows", width]))  # a typed value
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data")
    return weights


@pytest.mark.parametrize("hint", ["f16", "bf16"])
def test_an_fp16_graph_holds_its_weights_once_on_the_first_load_and_from_the_blob(tmp_path, hint):
    """Under the f16 hint the plugin packs the fp16 weights as they are, under bf16 those of the
    graph retyped to bf16 (written into the cache's staging folder, gone with it). The first load
    compiles and OpenVINO writes the blob to the cache as it exports (``export_model()`` would hold
    all of it in memory beside the weights read: twice); a later load imports it, its pages
    released as read."""
    needs(hint)
    path = tmp_path / "model.onnx"
    weights = fp16_chain(path)
    size = sum(w.nbytes for w in weights)
    x = np.random.default_rng(1).standard_normal((8, weights[0].shape[0])).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = x.astype(np.float64)
    for w in weights:
        want = want @ w.astype(np.float64)
    cache = tmp_path / "cache"
    runs = []
    for load in ("first", "cached"):
        out = tmp_path / f"y-{load}.npy"
        done = subprocess.run([sys.executable, "-c", CHILD, str(path), str(cache), str(tmp_path / "x.npy"), str(out), hint],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        got = np.load(out)
        assert float(((got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)).min()) >= 0.999
    first, cached = runs
    assert first["ran"] == cached["ran"] == hint and not first["from_cache"] and cached["from_cache"]
    # one copy of the weights plus the plugin's own (~150-200 MB at any size: threads, kernels,
    # scratch), never two: a blob exported into memory, the fp16 weights widened through f32, or
    # the blob's pages kept beside the plugin's packed weights would add the weights' bytes once more
    for run in runs:
        assert run["grew"] < size + PLUGIN_OWN, (run, size)
    blobs = sorted(cache.glob("*.blob"))
    assert len(blobs) == 1 and blobs[0].read_bytes()[:5] == b"<?xml"  # OpenVINO's CACHE_DIR wrote it
    assert blobs[0].stat().st_size < 1.1 * size  # two bytes a weight, as the plugin packed them
    assert not list(cache.glob(".compiling-*"))  # its staging folder (and a bf16 graph in it) is gone


def test_the_bf16_graph_keeps_the_gemm_weights_bf16_the_other_weights_fp16_and_every_activation_f32(tmp_path):
    """The retyping alone, on a graph with a weight GEMM, a norm-like scale and an embedding lookup:
    the GEMM's weight rounded to bf16 as torch rounds it (an independent conversion) and read
    between Casts to and from bf16, the scale and the table kept fp16 bit for bit behind a Cast to
    f32, no fp16 value type left; and what OpenVINO computes from it matches float64 NumPy on those
    weights."""
    import onnx
    import openvino as ov
    import torch
    from onnx import TensorProto, helper, numpy_helper

    from kvembed.backends.openvino import fp16_graph, write_bf16_graph

    rng = np.random.default_rng(3)
    width, vocab = 64, 50
    w = (rng.standard_normal((width, width)) / 8).astype(np.float16)
    scale = (1 + rng.standard_normal(width) / 10).astype(np.float16)
    table = rng.standard_normal((vocab, width)).astype(np.float16)
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["h0"], to=TensorProto.FLOAT16),
         helper.make_node("MatMul", ["h0", "w"], ["h1"]),
         helper.make_node("Mul", ["h1", "scale"], ["h2"]),
         helper.make_node("Gather", ["table", "ids"], ["e"]),
         helper.make_node("Add", ["h2", "e"], ["h3"]),
         helper.make_node("Cast", ["h3"], ["y"], to=TensorProto.FLOAT)],
        "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", width]),
                  helper.make_tensor_value_info("ids", TensorProto.INT64, ["rows"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", width])],
        [numpy_helper.from_array(v, n) for v, n in ((w, "w"), (scale, "scale"), (table, "table"))])
    graph.value_info.append(helper.make_tensor_value_info("h1", TensorProto.FLOAT16, ["rows", width]))
    source = tmp_path / "fp16" / "model.onnx"
    source.parent.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(source),
              save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    (tmp_path / "bf16").mkdir()
    target = write_bf16_graph(fp16_graph(source), source, tmp_path / "bf16")
    assert target == tmp_path / "bf16" / "model.onnx"
    model = onnx.load(str(target))
    types = {t.name: t.data_type for t in model.graph.initializer}
    assert types == {"w": TensorProto.BFLOAT16, "scale": TensorProto.FLOAT16, "table": TensorProto.FLOAT16}
    stored = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    want_w = torch.from_numpy(w).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(stored["w"].view(np.uint16), want_w)
    np.testing.assert_array_equal(stored["scale"].view(np.uint16), scale.view(np.uint16))
    np.testing.assert_array_equal(stored["table"].view(np.uint16), table.view(np.uint16))
    values = [*model.graph.input, *model.graph.output, *model.graph.value_info]
    assert all(v.type.tensor_type.elem_type != TensorProto.FLOAT16 for v in values)
    producer = {o: n for n in model.graph.node for o in n.output}
    matmul = next(n for n in model.graph.node if n.op_type == "MatMul")
    into = producer[matmul.input[0]]
    assert into.op_type == "Cast" and into.attribute[0].i == TensorProto.BFLOAT16 and matmul.input[1] == "w"
    out = next(n for n in model.graph.node if matmul.output[0] in n.input)
    assert out.op_type == "Cast" and out.attribute[0].i == TensorProto.FLOAT
    for weight, op in (("scale", "Mul"), ("table", "Gather")):
        reader = next(n for n in model.graph.node if n.op_type == op)
        cast = producer[reader.input[0 if op == "Gather" else 1]]
        assert cast.op_type == "Cast" and list(cast.input) == [weight] and cast.attribute[0].i == TensorProto.FLOAT

    x = rng.standard_normal((4, width)).astype(np.float32)
    ids = np.array([0, 7, 49, 7])
    compiled = ov.Core().compile_model(str(target), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    got = compiled({"x": x, "ids": ids})[compiled.outputs[0]]
    w_bf16 = torch.from_numpy(w).to(torch.bfloat16).double().numpy()
    x_bf16 = torch.from_numpy(x).to(torch.bfloat16).double().numpy()  # x's Cast to fp16 is f32 now, then bf16 into the GEMM
    want = (x_bf16 @ w_bf16) * scale.astype(np.float64) + table.astype(np.float64)[ids]
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


def test_a_bf16_graph_that_cannot_be_written_is_a_clear_error(tmp_path, monkeypatch):
    """No room for the bf16 copy (asked for more than any disk has): one line saying what to do,
    not a compile that widens the weights through f32 and may exhaust memory."""
    needs("bf16")
    from kvembed.backends import openvino

    fp16_chain(tmp_path / "model.onnx", layers=2, width=64)
    monkeypatch.setattr(openvino, "DISK_MARGIN", 2**62)
    with pytest.raises(InvalidInput, match="bf16 copy, which was not written .*free disk space or give OpenVINOOptions\\(cache_dir=...\\)"):
        openvino.OpenVINOSession(tmp_path / "model.onnx", precision="bf16", cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob(".compiling-*"))  # the staging folder and its partial copy are gone


def test_the_export_summary_says_an_alternative_refused_by_the_held_out_texts_is_not_certified(fp16):
    """The summary line of an advisory check follows the held-out verdict too, not the gate's alone."""
    from kvembed.cli.export import advisory_line
    advisory = load_manifest(fp16).parity.advisory
    ran = [(t, a) for t, a in advisory.items() if a.report is not None]
    if not ran:
        pytest.skip("no OpenVINO alternative ran on this CPU")
    target, record = ran[0]
    report = record.report
    assert report.passed and "certified: auto runs it" in advisory_line(target, report, "model.onnx")
    refused = advisory_line(target, report, "model.onnx", held_out_missed=0.99884)
    assert "below the bar on the held-out texts[/] (0.99884): not certified" in refused and "auto runs it" not in refused
