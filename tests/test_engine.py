"""kvembed build-engine without a GPU: the rules that decide a build, and its refusals.

No GPU or TensorRT exists here, so the build and the plan's execution are never run (README says
so); everything around them is plain Python and is checked for real: shape/profile rules against
an exported artifact's max_length, the version-dependent precision recipe, the engine.json schema
written by ``engine_record`` and read back by ``read_engine_json``, the GPU/TensorRT refusals,
the loader being built lazily, and the CLI exiting 2 naming what to install.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from kvembed.errors import CheckFailed, MissingDependency
from kvembed.artifact import Manifest
from kvembed.artifact.staging import staged
from kvembed.export.engine import (
    DEFAULT_SHAPES, EngineParityError, ShapeRange, build_engine, check_engine_parity, check_tensorrt_supports,
    choose_precision, default_shapes, engine_parity, engine_record, parse_shapes, parse_size,
)
from kvembed.export.gate.parity import GATE_TEXTS, PARITY_TEXTS, gate_batches
from kvembed.export.graph.trace import min_tensorrt
from kvembed.export.graph.ops import version_key
from kvembed.artifact import sha256_file
from engine_util import STAND_IN_PLAN, make_engine_dir
from kvembed.artifact.engine import ENGINE_JSON, ENGINE_KEYS, engine_limits, read_engine_json
from kvembed.backends.tensorrt import EngineSession, check_engine_matches, check_feeds_fit

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NO_TENSORRT = importlib.util.find_spec("tensorrt") is None


@pytest.fixture(scope="module")
def artifact(stories_artifact):
    return stories_artifact("mean")


@pytest.fixture(scope="module")
def manifest(artifact):
    return json.loads((artifact / "kvembed.json").read_text())


# -- shapes ----------------------------------------------------------------------------------------


def test_shapes_give_min_opt_max_of_batch_and_sequence():
    assert parse_shapes("1x16:8x128:32x512", 512) == ShapeRange((1, 16), (8, 128), (32, 512))
    assert parse_shapes(" 2X8 : 4x8 : 4x64 ", 64).to_dict() == {"min": [2, 8], "opt": [4, 8], "max": [4, 64]}


@pytest.mark.parametrize("spec,message", [
    ("1x16:8x128", "expected MIN:OPT:MAX"),
    ("1x16:8x128:32", "expected MIN:OPT:MAX"),
    ("1x16:8xa:32x512", "expected MIN:OPT:MAX"),
    ("0x16:8x128:32x512", ">= 1"),
    ("8x16:4x128:32x512", "batch must grow"),
    ("1x256:8x128:32x512", "sequence must grow"),
    ("1x16:8x128:32x513", "past the artifact's max_length 512; use at most 32x512"),
])
def test_bad_shapes_are_refused_by_name(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_shapes(spec, 512)


def test_default_shapes_are_clipped_to_the_artifact(manifest):
    limit = int(manifest["max_length"])
    shapes = default_shapes(limit)
    assert shapes.max[1] == min(512, limit) and shapes.opt[1] == min(128, limit)
    assert parse_shapes(DEFAULT_SHAPES, 512) == default_shapes(512)
    assert default_shapes(100) == ShapeRange((1, 16), (8, 100), (32, 100))


def test_sizes():
    assert parse_size("4GiB") == 4 * 1024**3 and parse_size("512MiB") == 512 * 1024**2
    assert parse_size("1.5GB") == 1_500_000_000 and parse_size("1048576") == 1048576
    for bad in ("four", "-1GiB", "4 PB", "0"):
        with pytest.raises(ValueError, match="size"):
            parse_size(bad)


# -- precision by TensorRT version ---------------------------------------------------------------


def test_tensorrt_10_uses_builder_flags_on_an_fp32_graph():
    plan = choose_precision("fp16", "10.14.1", "fp32")
    assert (plan.fp16, plan.bf16, plan.strongly_typed) == (True, False, False)
    plan = choose_precision("bf16", "10.9.0", "fp32")
    assert (plan.fp16, plan.bf16, plan.strongly_typed) == (False, True, False)
    assert not choose_precision("fp32", "10.0", "fp32").strongly_typed
    # an fp16 artifact keeps its own types (its fp32 islands) on 10 too
    plan = choose_precision("fp16", "10.14", "fp16")
    assert (plan.fp16, plan.strongly_typed) == (False, True)


def test_tensorrt_11_builds_strongly_typed_from_the_matching_artifact():
    plan = choose_precision("fp16", "11.0.0", "fp16")
    assert (plan.fp16, plan.bf16, plan.strongly_typed) == (False, False, True)
    assert choose_precision("fp32", "11.1", "fp32").strongly_typed
    with pytest.raises(ValueError, match="only strongly typed.*fp16 artifact.*--precision fp16"):
        choose_precision("fp16", "11.0", "fp32")
    with pytest.raises(ValueError, match="a bf16 engine needs a bf16 artifact.*no bf16-typed graph exists"):
        choose_precision("bf16", "11.0", "fp32")


@pytest.mark.parametrize("args,message", [
    (("fp16", "10.14", "int8"), "int8 artifact .* cannot become a TensorRT engine"),
    (("fp16", "8.6.1", "fp32"), "too old"),
    (("fp8", "10.14", "fp32"), "precision must be one of"),
    (("fp32", "10.14", "fp16"), "fp16 artifact builds only a fp16 engine"),
])
def test_precision_refusals(args, message):
    with pytest.raises(ValueError, match=message):
        choose_precision(*args)


def test_fused_attention_needs_tensorrt_10_14(manifest):
    assert manifest["graph"]["attention"]["form"] == "fused"
    typed = Manifest.from_dict(manifest)
    check_tensorrt_supports(typed, "10.14.1")
    check_tensorrt_supports(typed, "11.0")
    with pytest.raises(ValueError, match=r"needs TensorRT >= 10.14 \(installed: 10.13.0\).*--attention decomposed"):
        check_tensorrt_supports(typed, "10.13.0")
    decomposed = {**manifest, "graph": {**manifest["graph"], "attention": {"form": "decomposed",
                  "min_versions": {"tensorrt": "10.15"}}}}  # e.g. Causal2Vec's Gelu: no re-export helps
    check_tensorrt_supports(Manifest.from_dict(decomposed), "10.15")
    with pytest.raises(ValueError, match=r"needs TensorRT >= 10.15 \(installed: 10.0\); upgrade TensorRT"):
        check_tensorrt_supports(Manifest.from_dict(decomposed), "10.0")


def test_minimum_tensorrt_is_the_newest_any_op_needs():
    assert min_tensorrt({"MatMul", "Softmax"}) == "8.6"
    assert min_tensorrt({"MatMul", "Attention"}) == "10.14"
    assert min_tensorrt({"Attention", "Gelu", "LayerNormalization"}) == "10.15"
    assert min_tensorrt({"RotaryEmbedding", "Gelu"}) == "10.15.1"
    assert version_key("10.9.0.34") < version_key("10.14")  # as text, "10.9" > "10.14" < version_key("10.15") < version_key("10.15.1")


# -- engine.json ---------------------------------------------------------------------------------


def _record(artifact, manifest, **changes):
    ranges = [parse_shapes("1x16:8x128:32x512", 512), parse_shapes("1x8:1x8:1x64", 512)]
    record = engine_record(
        Manifest.from_dict(manifest), sha256_file(artifact / "model.onnx"), ranges, choose_precision("fp16", "10.14.1", "fp32"),
        tensorrt_version="10.14.1", gpu_name="NVIDIA L4", compute_capability="8.9", build_seconds=42.25,
        options={"workspace_bytes": 4 * 1024**3, "opt_level": 3, "timing_cache": None},
    )
    record.update(changes)
    return record


def test_engine_json_schema_round_trips(artifact, manifest, tmp_path):
    import hashlib

    record = _record(artifact, manifest)
    assert tuple(k for k in record if k in ENGINE_KEYS) == ENGINE_KEYS
    assert record["source"]["model_sha256"] == hashlib.sha256((artifact / "model.onnx").read_bytes()).hexdigest()
    assert record["source"]["attention"] == "fused" and record["source"]["max_length"] == manifest["max_length"]
    assert record["profiles"][0] == {"min": [1, 16], "opt": [8, 128], "max": [32, 512]}
    assert record["gpu"] == {"name": "NVIDIA L4", "compute_capability": "8.9"}
    assert record["inputs"] == ["input_ids", "attention_mask"]
    limits = engine_limits(record)  # profiles 1x16..32x512 and 1x8..1x64
    assert limits[:3] == (32, 8, 512)
    assert (limits.rows(8), limits.rows(15), limits.rows(16), limits.rows(64), limits.rows(512)) == (1, 1, 32, 32, 32)
    assert limits.rows(600) == 32  # no profile takes it: the largest batch (the run then says why)
    (tmp_path / ENGINE_JSON).write_text(json.dumps(record))
    assert read_engine_json(tmp_path) == record
    del record["gpu"]
    (tmp_path / ENGINE_JSON).write_text(json.dumps(record))
    with pytest.raises(ValueError, match="lacks gpu"):
        read_engine_json(tmp_path)
    with pytest.raises(FileNotFoundError, match="not an engine directory"):
        read_engine_json(artifact)


def test_a_plan_from_another_gpu_or_tensorrt_is_refused(artifact, manifest):
    record = _record(artifact, manifest)
    check_engine_matches(record, "10.14.1", "NVIDIA L4", "8.9")
    with pytest.raises(ValueError, match="built with TensorRT 10.14.1, this is TensorRT 10.15.0: rebuild"):
        check_engine_matches(record, "10.15.0", "NVIDIA L4", "8.9")
    with pytest.raises(ValueError, match=r"built for NVIDIA L4 \(compute capability 8.9\), this GPU is NVIDIA H100"):
        check_engine_matches(record, "10.14.1", "NVIDIA H100 80GB HBM3", "9.0")


def test_feeds_outside_every_profile_are_refused(artifact, manifest):
    record = _record(artifact, manifest)
    check_feeds_fit(record, (32, 512))
    check_feeds_fit(record, (1, 8))
    with pytest.raises(ValueError, match=r"64 x 100 tokens is outside every profile .*1x16..32x512, 1x8..1x64"):
        check_feeds_fit(record, (64, 100))


# -- the loader and the build, without TensorRT ----------------------------------------------------


@pytest.mark.skipif(not NO_TENSORRT, reason="checks the behaviour where TensorRT is absent")
def test_loader_is_lazy_and_names_what_to_install(artifact, manifest, tmp_path):
    (tmp_path / ENGINE_JSON).write_text(json.dumps(_record(artifact, manifest)))
    session = EngineSession(tmp_path)  # reads engine.json only
    assert not session.active and "tensorrt" not in sys.modules
    feeds = {"input_ids": np.ones((2, 20), np.int64), "attention_mask": np.ones((2, 20), np.int64)}
    with pytest.raises(MissingDependency, match="pip install tensorrt polygraphy"):
        session.run(feeds, ["embedding"])
    assert not session.active
    with pytest.raises(ValueError, match="outside every profile"):  # checked before TensorRT is needed
        session.run({k: np.ones((33, 20), np.int64) for k in feeds}, ["embedding"])


@pytest.mark.skipif(not NO_TENSORRT, reason="checks the behaviour where TensorRT is absent")
def test_build_checks_input_before_needing_tensorrt(artifact, tmp_path):
    with pytest.raises(ValueError, match="past the artifact's max_length"):
        build_engine(artifact, tmp_path / "e", shapes=["1x16:8x128:32x100000"])
    with pytest.raises(ValueError, match="opt-level"):
        build_engine(artifact, tmp_path / "e", opt_level=9)
    with pytest.raises(ValueError, match="is the artifact itself"):  # --force would write into it
        build_engine(artifact, artifact, force=True)
    with pytest.raises(MissingDependency, match="tensorrt"):
        build_engine(artifact, tmp_path / "e")
    assert not (tmp_path / "e").exists()


@pytest.mark.skipif(not NO_TENSORRT, reason="checks the behaviour where TensorRT is absent")
@pytest.mark.parametrize("extra,message", [
    ([], "needs the tensorrt package"),
    (["--fp16", "--bf16"], "exclude each other"),
    (["--shapes", "1x16:8x128"], "expected MIN:OPT:MAX"),
])
def test_cli_exits_2_with_one_line(artifact, tmp_path, extra, message):
    out = tmp_path / "engine"
    result = subprocess.run([sys.executable, "-m", "kvembed.cli", "build-engine", str(artifact), "--out", str(out), *extra],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


# -- an engine directory through the runtime and the Triton generator -----------------------------
# TensorRT cannot run here, so the plan's execution is done by a stand-in runner that runs the
# artifact's own model.onnx with onnxruntime and refuses any feed outside the active profile, as a
# TensorRT execution context does; everything around it (loading, verification, profile choice,
# padding to the profiles' minimum, splitting to their batch limit, truncation) is the real code.

class OnnxRuntimeStandIn:
    """polygraphy TrtRunner's set_profile/infer over onnxruntime, checking each feed against the
    active profile; records the (profile, batch, sequence) of every call."""

    def __init__(self, model, record):
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        self.record, self.profile, self.calls = record, 0, []

    def set_profile(self, index):
        self.profile = index

    def infer(self, feeds):
        batch, sequence = next(iter(feeds.values())).shape
        p = self.record["profiles"][self.profile]
        assert p["min"][0] <= batch <= p["max"][0] and p["min"][1] <= sequence <= p["max"][1], (self.profile, batch, sequence)
        self.calls.append((self.profile, batch, sequence))
        names = [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self.session.run(names, feeds)))

    def deactivate(self):
        pass


def test_embedder_runs_an_engine_directory_within_its_profiles(artifact, manifest, tmp_path, monkeypatch):
    from kvembed.runtime import Embedder

    engine = make_engine_dir(artifact, tmp_path / "engine")
    runners = []

    def activate(self):
        runners.append(OnnxRuntimeStandIn(artifact / "model.onnx", self.record))
        self._runner = runners[-1]

    monkeypatch.setattr(EngineSession, "_activate", activate)
    embedder = Embedder.load(engine)
    assert embedder.target == "tensorrt" and embedder.session.providers == ["TensorRT", "fp32"] and not embedder.session.active
    assert embedder.encoder.min_width == 8 and embedder.max_length == min(512, manifest["max_length"])
    reference = Embedder.load(artifact)
    short = ["hi", "a cat", *(f"dog {i} and a ball" for i in range(9))]  # one padded batch of 11 rows, < 64 tokens
    long = ["long " * 60, "x " * 150, "a shorter one among long ones " * 4]
    tiny = ["hi", "ok"]  # fewer tokens than any profile's minimum: padded up to 8
    for texts in (tiny, short, long):
        assert np.abs(embedder.encode(texts, batch_size=32) - reference.encode(texts, batch_size=32)).max() <= 1e-5
    calls = runners[0].calls
    assert {profile for profile, _, _ in calls} == {0, 1}, calls  # short batches on 0, long ones on 1
    assert calls[0][2] == 8 and all(sequence >= 8 for _, _, sequence in calls)  # padded to the profiles' minimum
    assert max(batch for profile, batch, _ in calls if profile == 0) == 4  # 11 short rows split to 4 + 4 + 3


def _stand_in_plan(monkeypatch, model):
    """Make every EngineSession run ``model`` (an ONNX file) through :class:`OnnxRuntimeStandIn`."""
    def activate(self):
        self._runner = OnnxRuntimeStandIn(model, self.record)

    monkeypatch.setattr(EngineSession, "_activate", activate)


def test_build_engines_parity_check_passes_a_faithful_plan(artifact, tmp_path, monkeypatch):
    """build-engine's check, as it runs after the build: the engine directory (profile padding and
    row limits included) against onnxruntime on the artifact, over the gate's texts and batches."""
    engine = make_engine_dir(artifact, tmp_path / "engine")
    _stand_in_plan(monkeypatch, artifact / "model.onnx")
    record = json.loads((engine / ENGINE_JSON).read_text())
    check_engine_parity(engine, artifact, record)
    written = json.loads((engine / ENGINE_JSON).read_text())["parity"]
    assert written == record["parity"] and written["passed"] and written["precision"] == "fp32"
    # every row of the gate: the core texts in each case (query/document x right/left), each variety group once
    assert written["rows"] == sum(len(batch.rows) for batch in gate_batches(GATE_TEXTS)) and written["worst_cosine"] >= 0.99999
    assert written["reference"]["runtime"] == "onnxruntime CPU"
    # independent of the code under test: one of the checked batches, recomputed with numpy
    from kvembed.runtime import Embedder

    ours, theirs = Embedder.load(engine), Embedder.load(artifact)
    batch = ours.encoder.pad(ours.encoder.encode(list(PARITY_TEXTS.values()), "query"), "right")
    a, b = ours.run(batch)[0], theirs.run(batch)[0]
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert written["by_case"]["query/right"]["worst_cosine"] <= cos.min() + 1e-9


def test_build_engines_parity_check_refuses_a_plan_off_by_more_than_its_precision(artifact, stories_artifact, tmp_path, monkeypatch):
    """A plan that computes in fp16 (the fp16 artifact's graph stands in) misses an fp32 engine's
    bound, and EngineParityError (exit 1, a check that failed) says what to do; as fp16 it passes."""
    engine = make_engine_dir(artifact, tmp_path / "engine")
    _stand_in_plan(monkeypatch, stories_artifact("mean", "fp16") / "model.onnx")
    record = json.loads((engine / ENGINE_JSON).read_text())
    with pytest.raises(EngineParityError, match=r"parity FAILED \(fp32\).*--no-parity") as caught:
        check_engine_parity(engine, artifact, record)
    assert isinstance(caught.value, CheckFailed)
    report = caught.value.report
    assert report.worst_cosine < 0.99999 or report.max_abs_diff > 1e-4
    assert report.worst_cosine >= 0.999  # fp16 is close, just not fp32-close
    assert json.loads((engine / ENGINE_JSON).read_text())["parity"]["passed"] is False  # recorded either way
    assert engine_parity(engine, artifact, "fp16").passed


def test_staged_output_appears_only_when_its_block_succeeds(tmp_path):
    """build-engine and the exporter write beside OUT and rename: a failed build leaves OUT as it was."""
    out = tmp_path / "engine"
    out.mkdir()
    (out / "kept.txt").write_text("the previous engine")
    with pytest.raises(RuntimeError):
        with staged(out) as staging:
            (staging / "engine.plan").write_text("a plan that missed its check")
            raise RuntimeError("the build or its parity check failed")
    assert [p.name for p in tmp_path.iterdir()] == ["engine"] and (out / "kept.txt").read_text() == "the previous engine"
    with staged(out) as staging:
        (staging / "engine.plan").write_text("a good plan")
    assert [p.name for p in out.iterdir()] == ["engine.plan"] and [p.name for p in tmp_path.iterdir()] == ["engine"]


def test_engine_directory_refusals(artifact, manifest, tmp_path):
    from kvembed.runtime import Embedder

    engine = make_engine_dir(artifact, tmp_path / "engine")
    with pytest.raises(ValueError, match="TensorRT engine directory: it runs with provider 'tensorrt'"):
        Embedder.load(engine, provider="cpu")
    if NO_TENSORRT:
        with pytest.raises(MissingDependency, match="running a TensorRT engine needs the tensorrt package"):
            Embedder.load(engine, provider="tensorrt").encode(["a text"])
    (engine / "engine.plan").write_bytes(STAND_IN_PLAN + b"!")
    with pytest.raises(ValueError, match="engine.plan does not match its sha256 in engine.json; rebuild"):
        Embedder.load(engine)
    (engine / "engine.plan").write_bytes(STAND_IN_PLAN)
    record = json.loads((engine / ENGINE_JSON).read_text())
    record["source"]["model_sha256"] = "0" * 64
    (engine / ENGINE_JSON).write_text(json.dumps(record))
    with pytest.raises(ValueError, match="files of two exports mixed"):
        Embedder.load(engine)
    Embedder.load(engine, verify=False)  # the user's call


def test_triton_repository_serves_the_engine_plan(artifact, manifest, tmp_path):
    """--backend tensorrt on an engine directory: the plan copied in, every config's max batch =
    the largest profile batch, one instance profile per engine profile, the tokenizer cut and
    padded to the profiles' sequence range. (Loading it needs Triton's TensorRT backend: the
    real-server check of that is in test_triton.py.)"""
    pytest.importorskip("tritonclient")
    from kvembed.triton import write_repository
    from kvembed.triton.configs import read_config

    engine = make_engine_dir(artifact, tmp_path / "engine")
    repo = write_repository(engine, tmp_path / "repo", "eng", backend="tensorrt", preferred_batch_sizes=[2, 16])
    model, tokenize, ensemble = (read_config(repo / name) for name in ("eng_model", "eng_tokenize", "eng"))
    assert model.platform == "tensorrt_plan" and (repo / "eng_model" / "1" / "model.plan").read_bytes() == STAND_IN_PLAN
    assert not (repo / "eng_model" / "build_plan.sh").exists()
    assert model.max_batch_size == tokenize.max_batch_size == ensemble.max_batch_size == 4
    assert list(tokenize.dynamic_batching.preferred_batch_size) == [2]
    assert list(model.instance_group[0].profile) == ["0", "1"]
    assert tokenize.parameters["min_length"].string_value == "8"
    assert tokenize.parameters["max_length"].string_value == str(min(512, manifest["max_length"]))
    readme = (repo / "README.md").read_text()
    assert "TensorRT 10.14.1, NVIDIA L4 (compute capability 8.9)" in readme and "build_plan.sh" not in readme
    with pytest.raises(ValueError, match="served with --backend tensorrt"):
        write_repository(engine, tmp_path / "repo2", "eng", backend="python")
    (engine / "engine.plan").write_bytes(b"damaged")
    with pytest.raises(ValueError, match="engine.plan does not match"):
        write_repository(engine, tmp_path / "repo3", "eng", backend="tensorrt")
