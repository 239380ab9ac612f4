"""The backends catalogue: every backend file is listed, each probe tells the truth about this
machine (real probes, no mocks), sessions follow the protocol, and ``Embedder.load`` still takes
every keyword it ever took."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from kvembed.backends import catalogue
from kvembed.backends.onnxruntime import DISABLE_PREPACKING, OnnxRuntimeOptions
from kvembed.backends.openvino import OpenVINOOptions
from kvembed.backends.protocol import Session
from kvembed.export.gate import targets
from kvembed.runtime import Embedder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOM = Path(catalogue.__file__).parent
#: Embedder.load's own keywords and defaults (the backends' settings are their options dataclasses)
KEYWORDS = {"provider": "auto", "threads": None, "options": None, "verify": True, "max_call_tokens": "auto", "call_cost": "auto"}
#: the flat backend keywords of earlier versions -> the options field named in the error that replaces each
REMOVED = {
    "device_id": "OnnxRuntimeOptions(device_id=", "trt_cache_dir": "OnnxRuntimeOptions(trt_cache_dir=",
    "trt_fp16": "OnnxRuntimeOptions(trt_fp16=", "memory_arena": "OnnxRuntimeOptions(memory_arena=",
    "prepacking": "OnnxRuntimeOptions(prepacking=", "spinning": "OnnxRuntimeOptions(spinning=",
    "ov_precision": "OpenVINOOptions(precision=", "ov_cache_dir": "OpenVINOOptions(cache_dir=",
}


@pytest.fixture(scope="module")
def artifact(stories_artifact):
    return stories_artifact("kv-embedding")


def test_the_catalogue_lists_every_backend_file():
    files = {p.stem for p in ROOM.glob("*.py")} - {"__init__", "protocol", "catalogue", "targets", "cpu"}
    assert set(catalogue.BACKENDS) == files == {"onnxruntime", "openvino", "tensorrt"}
    for name, backend in catalogue.BACKENDS.items():
        module = backend.load()
        assert module.NAME == name and callable(module.probe) and callable(module.open_graph) and callable(module.weight_factor)
        assert backend.options_type().__module__ == module.__name__
        assert set(backend.providers) <= set(catalogue.PROVIDERS)
    assert catalogue.PROVIDERS == ("auto", "cpu", "cuda", "tensorrt", "openvino")
    assert catalogue.PROVIDER_HELP == "auto, cpu, cuda, tensorrt, openvino"
    assert {t.backend for t in targets.TARGETS.values()} == {*catalogue.BACKENDS, "onnx-reference"}
    assert all(name in targets.TARGETS_HELP for name in targets.TARGET_NAMES)


def test_each_probe_says_why_it_cannot_run_here():
    """Whatever this machine has: a probe is None exactly where its backend can run, else it names the fix."""
    gpu = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    assert catalogue.provider_problem("cpu") is None and catalogue.provider_problem("auto") is None
    cuda = catalogue.provider_problem("cuda")
    assert (cuda is None) == gpu
    if not gpu:
        assert "no CUDAExecutionProvider" in cuda and "kvembed[gpu]" in cuda
    trt_ep = catalogue.provider_problem("tensorrt")
    if "TensorrtExecutionProvider" not in onnxruntime.get_available_providers():
        assert "no TensorrtExecutionProvider" in trt_ep
    tensorrt = catalogue.BACKENDS["tensorrt"].probe()
    if importlib.util.find_spec("tensorrt") is None:
        assert tensorrt.startswith("not installed") and "developer.nvidia.com/tensorrt" in tensorrt
    openvino = catalogue.BACKENDS["openvino"].probe()
    if importlib.util.find_spec("openvino") is None:
        assert "pip install 'kvembed[openvino]'" in openvino
    assert catalogue.provider_problem("openvino") == openvino
    assert catalogue.BACKENDS["onnxruntime"].probe() is None
    absent = targets.target_problems()
    assert "onnxruntime-cpu" not in absent and ("onnxruntime-cuda" in absent) == (not gpu)
    with pytest.raises(ValueError, match="provider must be one of auto, cpu"):
        catalogue.provider_problem("vulkan")


def test_auto_picks_onnxruntime_for_an_artifact(artifact, tmp_path):
    assert catalogue.backend_for(artifact, "auto") == "onnxruntime"
    assert catalogue.backend_for(artifact, "openvino") == "openvino"
    (tmp_path / "engine.json").write_text("{}")
    assert catalogue.backend_for(tmp_path, "auto") == "tensorrt"
    with pytest.raises(ValueError, match="TensorRT engine directory"):
        catalogue.backend_for(tmp_path, "cpu")


def test_embedder_load_passes_each_backends_own_options_through(artifact):
    parameters = inspect.signature(Embedder.load).parameters
    for name, default in KEYWORDS.items():
        assert parameters[name].default == default, name
    embedder = Embedder.load(
        artifact, provider="cpu", threads=1, verify=True, max_call_tokens=64, call_cost=None,
        options=[OpenVINOOptions(precision="f32"), OnnxRuntimeOptions(memory_arena=False, prepacking=False)],
    )
    assert isinstance(embedder.session, Session) and embedder.target == "onnxruntime-cpu"
    options = embedder.session.get_session_options()  # the onnxruntime session's own methods stay reachable
    assert not options.enable_cpu_mem_arena and options.get_session_config_entry(DISABLE_PREPACKING) == "1"
    assert options.intra_op_num_threads == 1 and embedder.max_call_tokens == 64 and embedder.call_cost is None
    assert embedder.session.limits is None
    vector = embedder.encode("a short text")
    same = Embedder.load(artifact, "cpu", options=OnnxRuntimeOptions(threads=1, memory_arena=False))
    assert not same.session.get_session_options().enable_cpu_mem_arena
    np.testing.assert_allclose(same.encode("a short text"), vector, atol=1e-6)
    with pytest.raises(ValueError, match="threads=2 and OnnxRuntimeOptions\\(threads=1\\): give it once"):
        Embedder.load(artifact, "cpu", 2, options=OnnxRuntimeOptions(threads=1))
    with pytest.raises(ValueError, match="two OnnxRuntimeOptions: give one per backend"):
        Embedder.load(artifact, "cpu", options=[OnnxRuntimeOptions(), OnnxRuntimeOptions(prepacking=False)])
    with pytest.raises(ValueError, match="takes OnnxRuntimeOptions, got OpenVINOOptions"):
        Embedder.load(artifact, "cpu", options=OpenVINOOptions())
    with pytest.raises(ValueError, match="options= takes a backend's options .* got dict"):
        Embedder.load(artifact, "cpu", options={"memory_arena": False})
    with pytest.raises(ValueError, match="provider must be one of"):
        Embedder.load(artifact, provider="vulkan")


@pytest.mark.parametrize("keyword", sorted(REMOVED))
def test_a_removed_flat_keyword_names_the_field_that_holds_it_now(artifact, keyword):
    with pytest.raises(TypeError) as raised:
        Embedder.load(artifact, "cpu", **{keyword: None})
    assert REMOVED[keyword] in str(raised.value) and f"not {keyword}=" in str(raised.value)
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        Embedder.load(artifact, "cpu", colour="red")


def test_session_memory_reads_the_backend_factor(artifact):
    graph = sum(p.stat().st_size for p in Path(artifact).iterdir() if p.name.startswith("model.onnx"))
    assert catalogue.session_memory(artifact, "cpu") == int(graph * 1.0 + catalogue.SESSION_OVERHEAD)
    assert catalogue.session_memory(artifact, "openvino") == int(graph * 2.5 + catalogue.SESSION_OVERHEAD)


def test_the_choice_names_the_target_that_ran(artifact):
    """``Choice.target`` is what the session reports it runs, the hint given in options included;
    ``Embedder.backend`` still answers, with a deprecation warning."""
    cpu = Embedder.load(artifact, provider="cpu")
    assert cpu.choice.target == cpu.target == "onnxruntime-cpu"
    with pytest.warns(DeprecationWarning, match="use Embedder.target"):
        assert cpu.backend == "onnxruntime-cpu"
    if catalogue.BACKENDS["openvino"].probe() is None:
        asked = Embedder.load(artifact, provider="openvino", options=OpenVINOOptions(precision="f32", cache_dir=False))
        assert asked.choice.target == asked.target == "openvino-f32"
