"""Big artifacts downstream of the exporter (issue 30, item 4): what a loaded CPU session keeps
resident, how ``kvembed triton build`` places the weights, and what Ray reserves per actor.

Memory is read from the kernel (``/proc/<pid>/smaps_rollup``) of fresh processes holding real
onnxruntime sessions over real external-data files; the Triton repository is served by a real
``tritonserver`` after its source artifact is deleted; Ray is a real local cluster.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from kvembed import OnnxRuntimeOptions

from kvembed.runtime import Embedder
from kvembed.backends.onnxruntime import DISABLE_PREPACKING
from kvembed.triton import write_repository

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MIB = 1024**2
WIDTH, DEPTH = 1024, 16  # 16 MatMuls of 1024 x 1024 fp32: 64 MiB of weights


# -- a graph with real external-data weights ------------------------------------------------------


@pytest.fixture(scope="module")
def weights_graph(tmp_path_factory) -> tuple[Path, int]:
    """``y = x @ W1 @ ... @ W16`` with the weights in ``model.onnx.data``, written by onnx_ir as the
    exporter writes artifacts (tensors aligned in the file, so onnxruntime can map them); and the
    weights' bytes."""
    import onnx
    import onnx_ir as ir
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((WIDTH, WIDTH)) / 32).astype(np.float32), f"w{i}") for i in range(DEPTH)]
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", f"w{i}"], [f"h{i + 1}" if i < DEPTH - 1 else "y"]) for i in range(DEPTH)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", WIDTH])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    folder = tmp_path_factory.mktemp("weights-graph")
    ir.save(ir.from_proto(model), folder / "model.onnx", external_data="model.onnx.data", size_threshold_bytes=1024)
    del model, graph, weights
    assert onnx.load(str(folder / "model.onnx"), load_external_data=False).graph.initializer[0].data_location == TensorProto.EXTERNAL
    return folder / "model.onnx", DEPTH * WIDTH * WIDTH * 4


HOLD = """
import json, sys, time
from pathlib import Path
import numpy as np
from kvembed.backends.onnxruntime import create_session

def rollup():
    # anonymous memory of the process, and Rss / Pss of its mappings of the weights file
    out = {"Anonymous": 0, "Rss_data": 0, "Pss_data": 0}
    mapping = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if not fields[0].endswith(":"):  # a mapping's header line: address range ... [path]
            mapping = fields[5] if len(fields) > 5 else ""
        elif fields[0] == "Anonymous:":
            out["Anonymous"] += int(fields[1]) * 1024
        elif fields[0] in ("Rss:", "Pss:") and mapping.endswith("model.onnx.data"):
            out[fields[0][:-1] + "_data"] += int(fields[1]) * 1024
    return out

def hwm():
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024

before, peak_before = rollup(), hwm()
prepacking = json.loads(sys.argv[2])
session = create_session(sys.argv[1], "cpu", threads=1, memory_arena=False, prepacking=prepacking)
session.run(["y"], {"x": np.ones((64, %d), np.float32)})
barrier = Path(sys.argv[3]) if len(sys.argv) > 3 else None

def meet(stage):  # wait until both processes reach ``stage``
    (barrier / f"{stage}-{time.time_ns()}").touch()
    while len(list(barrier.glob(f"{stage}-*"))) < 2:
        time.sleep(0.05)

if barrier is not None:  # measure while the other process holds its session too
    meet("ready")
after = rollup()
if barrier is not None:  # and stay until the other one has measured as well
    meet("measured")
print(json.dumps({"anonymous": after["Anonymous"] - before["Anonymous"], "rss_file": after["Rss_data"],
                  "pss_file": after["Pss_data"], "peak": hwm() - peak_before}))
""" % WIDTH


def hold(graph: Path, prepacking: bool, barrier: Path | None = None) -> subprocess.Popen:
    args = [sys.executable, "-c", HOLD, str(graph), json.dumps(prepacking)] + ([str(barrier)] if barrier else [])
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(process: subprocess.Popen) -> dict[str, int]:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def test_prepacking_replaces_the_mapped_weights_without_a_second_copy_at_peak(weights_graph):
    """The default (pre-packing on): after a call the weights are a packed private copy and the
    mapped file's pages are gone; packing replaced them tensor by tensor, so the process never
    held both (its peak grew by about the weights, not twice them). ``prepacking=False``: the
    weights stay file-backed pages of ``model.onnx.data`` and the process's own memory barely grows."""
    graph, weights = weights_graph
    packed = result(hold(graph, True))
    assert packed["anonymous"] >= 0.9 * weights and packed["rss_file"] <= 0.1 * weights, packed
    assert packed["peak"] <= 1.35 * weights, packed
    mapped = result(hold(graph, False))
    assert mapped["rss_file"] >= 0.9 * weights, mapped
    assert mapped["anonymous"] <= 0.25 * weights, mapped


def test_without_prepacking_two_processes_share_one_copy_of_the_weights(weights_graph, tmp_path):
    """Two processes holding ``prepacking=False`` sessions of the same file at once: the mapped
    weights are the page cache's, so each process's proportional share (PSS) of them is about half."""
    graph, weights = weights_graph
    pair = [hold(graph, False, tmp_path) for _ in range(2)]
    both = [result(process) for process in pair]
    for item in both:
        assert item["rss_file"] >= 0.9 * weights, both
        assert item["pss_file"] <= 0.6 * weights, both


def test_embedder_load_prepacks_unless_told_not_to(stories_artifact):
    artifact = stories_artifact("va", layers="1-2")
    default = Embedder.load(artifact, provider="cpu")
    mapped = Embedder.load(artifact, provider="cpu", options=OnnxRuntimeOptions(prepacking=False))
    assert default.session.get_session_options().get_session_config_entry(DISABLE_PREPACKING) == "0"
    assert mapped.session.get_session_options().get_session_config_entry(DISABLE_PREPACKING) == "1"
    texts = ["a short text", "the cat sat on the mat and looked at the sun for a while"]
    np.testing.assert_allclose(mapped.encode(texts), default.encode(texts), atol=1e-6)


def test_an_fp16_artifact_on_the_cpu_provider_says_what_it_costs(stories_artifact):
    """onnxruntime's CPU provider casts fp16 weights to fp32 copies at load: the user is told once,
    with what to use instead; fp32 loads say nothing."""
    with pytest.warns(UserWarning, match=r"fp16 artifact on onnxruntime's CPU provider.*int8 or fp32 artifact"):
        Embedder.load(stories_artifact("kv-embedding", "fp16"), provider="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Embedder.load(stories_artifact("kv-embedding"), provider="cpu")


# -- Triton repositories: the weights hard-linked ---------------------------------------------------


@pytest.fixture(scope="module")
def external_artifact(stories_artifact, tmp_path_factory) -> Path:
    """The demo kv-embedding artifact laid out as a big one is (the exporter moves weights to
    ``model.onnx.data`` from 256 MiB on): the same graph re-saved with its weights as external
    data, and the manifest's file records rewritten."""
    import onnx

    from kvembed.artifact import MODEL, file_records, load_manifest, write_manifest

    source = stories_artifact("kv-embedding")
    out = Path(shutil.copytree(source, tmp_path_factory.mktemp("external") / "kv"))
    model = onnx.load(str(out / MODEL))
    onnx.save_model(model, str(out / MODEL), save_as_external_data=True, location=MODEL + ".data", size_threshold=1024)
    manifest = load_manifest(out)
    write_manifest(out, manifest.updated(files=file_records(out)))
    assert (out / (MODEL + ".data")).stat().st_size > (out / MODEL).stat().st_size
    return out


def _same_file(a: Path, b: Path) -> bool:
    return (a.stat().st_dev, a.stat().st_ino) == (b.stat().st_dev, b.stat().st_ino)


@pytest.mark.parametrize("backend", ["python", "onnxruntime"])
def test_triton_build_hard_links_the_weights_and_copies_the_small_files(external_artifact, tmp_path, backend):
    artifact = external_artifact
    said: list[str] = []
    repo = write_repository(artifact, tmp_path / "repo", "kv", backend=backend, say=said.append)
    folder = repo / "kv_model" / "1" / ("artifact" if backend == "python" else "")
    assert _same_file(folder / "model.onnx.data", artifact / "model.onnx.data")
    assert (artifact / "model.onnx.data").stat().st_nlink >= 2
    for name in ("model.onnx", *(["kvembed.json", "tokenizer.json"] if backend == "python" else [])):
        assert (folder / name).read_bytes() == (artifact / name).read_bytes()
        assert not _same_file(folder / name, artifact / name), name
    assert said == []


def test_triton_build_copies_the_weights_across_filesystems_and_says_so(external_artifact):
    shm = Path("/dev/shm")
    artifact = external_artifact
    if not shm.is_dir() or shm.stat().st_dev == artifact.stat().st_dev:
        pytest.skip("no second filesystem (/dev/shm) here")
    out = Path(shm) / f"kvembed-test-repo-{os.getpid()}"
    said: list[str] = []
    try:
        repo = write_repository(artifact, out, "kv", say=said.append)
        copy = repo / "kv_model" / "1" / "artifact" / "model.onnx.data"
        assert copy.read_bytes() == (artifact / "model.onnx.data").read_bytes()
        assert copy.stat().st_nlink == 1
    finally:
        shutil.rmtree(out, ignore_errors=True)
    assert len(said) == 1 and said[0].startswith("copied 1 weight file(s)"), said


def test_triton_serves_a_hard_linked_repository_after_the_artifact_is_deleted(external_artifact, tmp_path):
    """The repository keeps working when the artifact directory it was built from is gone: the
    hard-linked weights live on under the repository's name (a symlink would dangle)."""
    from kvembed.triton.client import infer, make_client
    from triton_util import assert_close, require_tritonserver, stub_python

    from kvembed.triton.server import TritonServer

    require_tritonserver()
    artifact = Path(shutil.copytree(external_artifact, tmp_path / "artifact"))
    texts = ["A man is playing a guitar.", "Ünïcödé café — 東京 🤖", "What is the capital of France?"]
    want = Embedder.load(artifact, provider="cpu").encode(texts)
    repo = write_repository(artifact, tmp_path / "repo", "kv")
    shutil.rmtree(artifact)
    with open(tmp_path / "triton.log", "w") as log, TritonServer(repo, python=stub_python(), log=log) as server:
        client = make_client("http", server)
        try:
            got = infer(client, "http", "kv", texts)["embedding"]
        finally:
            client.close()
    assert_close(got, want, "repository of a deleted artifact")


# -- embed-corpus on Ray: memory reserved per actor ------------------------------------------------


LOAD_AND_EMBED = """
import json, sys
from pathlib import Path
def hwm():
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024
from kvembed.runtime import Embedder
before = hwm()
embedder = Embedder.load(sys.argv[1], provider="cpu", threads=1)
embedder.encode(["the cat sat on the mat and looked at the sun " * 12] * 16)
print(json.dumps({"grew": hwm() - before}))
"""


def test_session_memory_covers_what_a_loaded_session_takes(external_artifact):
    """What a Ray actor reserves (session_memory) is at least what loading the artifact and
    embedding a 16-text batch made the process grow by, measured by the kernel (VmHWM)."""
    from kvembed.backends.catalogue import session_memory

    run = subprocess.run([sys.executable, "-c", LOAD_AND_EMBED, str(external_artifact)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    grew = json.loads(run.stdout.strip().splitlines()[-1])["grew"]
    graph = sum((external_artifact / name).stat().st_size for name in ("model.onnx", "model.onnx.data"))
    assert graph <= grew <= session_memory(external_artifact), (graph, grew, session_memory(external_artifact))


@pytest.fixture(scope="module")
def ray_cluster(external_artifact):
    """A local Ray whose memory resource holds one actor of ``external_artifact`` but not two."""
    import ray

    from kvembed.corpus.ray_runner import ACTOR_OVERHEAD
    from kvembed.backends.catalogue import session_memory

    need = session_memory(external_artifact) + ACTOR_OVERHEAD
    ray.init(num_cpus=2, _memory=int(1.5 * need), include_dashboard=False, logging_level=logging.WARNING)
    yield ray, need
    ray.shutdown()


def test_ray_actors_reserve_the_memory_of_their_session(ray_cluster, external_artifact, tmp_path):
    """Two actors do not fit the cluster's memory: refused before any actor starts, naming the
    figure. One does: its shards come back from the actor with the memory Ray reserved for it,
    exactly the figure computed from the artifact's files, and every row embedded."""
    from kvembed.corpus import CorpusError, CorpusOptions, embed_corpus
    from kvembed.corpus.plan import make_plan
    from kvembed.corpus.progress import CorpusProgress
    from kvembed.corpus.ray_runner import run_ray
    from kvembed.corpus.worker import Job

    ray, need = ray_cluster
    texts = [f"text number {i} about a cat on a mat" for i in range(40)]
    (tmp_path / "docs.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=rf"--workers 2 actors each need {need / 1e9:.1f} GB of memory"):
        embed_corpus(CorpusOptions(external_artifact, [str(tmp_path / "docs.txt")], tmp_path / "two", runner="ray",
                                   workers=2, threads=1, progress=False))
    options = CorpusOptions(external_artifact, [str(tmp_path / "docs.txt")], tmp_path / "one", runner="ray", workers=1,
                            threads=1, rows_per_file=20, progress=False)
    plan = make_plan(options)
    job = Job(artifact=str(external_artifact), threads=1, kind="document", max_batch_tokens=4096, output_dtype="float32",
              on_error="fail", columns=plan.columns, files=tuple(plan.files), output=str(options.output))
    options.output.mkdir()
    with CorpusProgress(len(texts), 0, False) as progress:
        stats = list(run_ray(job, plan.shards, 1, progress))
    assert sorted(item["shard"] for item in stats) == sorted(shard.name for shard in plan.shards) and len(stats) == 2
    assert sum(item["rows"] for item in stats) == len(texts)
    assert [item["ray_resources"].get("memory") for item in stats] == [need, need], stats
