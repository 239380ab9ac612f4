"""An fp16 artifact on OpenVINO under the f16 hint: its weights stay fp16 (onnxruntime's CPU provider
holds fp32 copies, twice the memory). The export's advisory check certifies it at fp16's bar against
PyTorch, and ``provider="auto"`` then runs it there on a CPU with FP16 (AVX-512 FP16, AMX-FP16).

The first load compiles and has OpenVINO stream the blob to the cache (``CACHE_DIR``) instead of
holding it in memory; later loads import the blob. Both are measured here by the kernel's VmHWM in
a child process, against the bytes of an fp16 weight chain built in the test.

This machine's CPU has FP16; one without it is stated with ``KVEMBED_CPU_FEATURES``, never run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import UNSEEN, unit

pytest.importorskip("openvino", reason="the f16 hint is OpenVINO's (pip install 'kvembed[openvino]')")

from kvembed.artifact import load_manifest  # noqa: E402
from kvembed.backends.cpu import cpu_features  # noqa: E402
from kvembed.runtime import Embedder  # noqa: E402

#: what OpenVINO's CPU plugin holds of its own beyond a model's weights, whatever their size
PLUGIN_OWN = 256 * 1024**2
#: a CPU with BF16 but no FP16 (Zen 4, Cooper Lake)
NO_FP16 = "avx2,avx512f,avx512_bf16"


@pytest.fixture(scope="module", autouse=True)
def fp16_cpu():
    if not cpu_features().fp16:
        pytest.skip("this CPU has no FP16 (the no-FP16 paths are tested by stating one with KVEMBED_CPU_FEATURES)")


@pytest.fixture(scope="module")
def fp16(stories_artifact):
    return stories_artifact("kv-embedding", "fp16")


def test_the_advisory_check_certifies_openvino_f16_and_auto_takes_it(fp16, oracle):
    manifest = load_manifest(fp16)
    ov = manifest.certificate("openvino", "fp16")
    assert ov is not None and ov.target == "openvino-f16" and ov.raw["graph"] == "model.onnx"
    assert ov.min_cosine == 0.999 and 0.999 <= ov.worst_cosine <= 1.0
    advisory = manifest.parity["advisory"]["openvino-f16"]
    assert advisory["worst_cosine"] == ov.worst_cosine and advisory["held_out"]["backend"] == "openvino-f16"
    fast = Embedder.load(fp16, ov_cache_dir=False)
    assert fast.backend == "openvino-f16" and "fp16 artifact certified on OpenVINO" in fast.choice.reason
    assert "FP16 (avx512_fp16" in fast.choice.reason or "amx_fp16" in fast.choice.reason
    stories = oracle("stories260k")
    for kind in ("document", "query"):
        want = unit(np.stack([stories.embed("kv-embedding", text, kind, layers="1-3") for text in UNSEEN]))
        got = fast.encode(UNSEEN, kind=kind, batch_size=8)
        assert float((got * want).sum(-1).min()) >= 0.999
        # fp16 arithmetic normalises to ~1e-4; the runtime gives unit rows all the same
        np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, atol=1e-6)


def test_without_fp16_auto_stays_on_onnxruntime_and_the_hint_runs_f32(fp16, monkeypatch):
    monkeypatch.setenv("KVEMBED_CPU_FEATURES", NO_FP16)
    stated = Embedder.load(fp16)
    assert stated.backend == "onnxruntime-cpu" and "no FP16" in stated.choice.reason
    assert "twice the memory" in stated.choice.reason
    asked = Embedder.load(fp16, provider="openvino", ov_precision="f16", ov_cache_dir=False)
    assert asked.backend == "openvino-f32"  # as OpenVINO itself runs the f16 hint on such a CPU


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
    session = OpenVINOSession(sys.argv[1], precision="f16", cache_dir=sys.argv[2])
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
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data")
    return weights


def test_an_fp16_graph_holds_its_weights_once_on_the_first_load_and_from_the_blob(tmp_path):
    """Under the f16 hint the plugin packs the fp16 weights as they are. The first load compiles and
    OpenVINO writes the blob to the cache as it exports (``export_model()`` would hold all of it in
    memory beside the weights read: twice); a later load imports it, its pages released as read."""
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
        done = subprocess.run([sys.executable, "-c", CHILD, str(path), str(cache), str(tmp_path / "x.npy"), str(out)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        got = np.load(out)
        assert float(((got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)).min()) >= 0.999
    first, cached = runs
    assert first["ran"] == cached["ran"] == "f16" and not first["from_cache"] and cached["from_cache"]
    # one copy of the weights plus the plugin's own (~150-200 MB at any size: threads, kernels,
    # scratch), never two: a blob exported into memory, or the blob's pages kept beside the
    # plugin's packed weights, would add the weights' bytes once more
    for run in runs:
        assert run["grew"] < size + PLUGIN_OWN, (run, size)
    blobs = sorted(cache.glob("*.blob"))
    assert len(blobs) == 1 and blobs[0].read_bytes()[:5] == b"<?xml"  # OpenVINO's CACHE_DIR wrote it
    assert not list(cache.glob(".compiling-*"))  # its staging folder is gone
