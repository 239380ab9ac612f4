"""Triton model repositories (``kvembed triton``), proven on a real ``tritonserver``.

The server is the Triton 2.51 binary of the nvidia-pytriton wheel (python backend only), started
on free ports over real sockets, with the python-backend models in the stub environment
(``.venv-triton``: numpy<2, onnxruntime, tokenizers, and no kvembed, so the repository's copied
runtime is what runs). Every embedding is checked against ``Embedder.encode`` of the same
artifact in this process, the independent oracle.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvembed.artifact import load_manifest
from kvembed.runtime import Embedder, read_manifest
from kvembed.runtime.artifact import encoder_from_manifest
from kvembed.triton import write_repository
from kvembed.triton.configs import read_config
from kvembed.triton.rows import decode_strings, split_rows, unpad_rows
from kvembed.triton.server import Ports, TritonServer
from conftest import HANG_GUARD_S
from engine_util import make_engine_dir
from kvembed.triton.client import client_module, infer
from triton_util import (
    Clients, announced_endpoints, assert_close, child_pids, listening_sockets, require_tritonserver, stub_python,
)
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXTS = ["A man is playing a guitar.", "", "   ", "Ünïcödé café — 東京 🤖", "What is the capital of France? It is Paris.",
         'He said "stop" and left', "x" * 3000]
LONG = "The quick brown fox jumps over the lazy dog. " * 4445  # 200,025 characters
#: requests per client in the load test (the issue's full size, 200, runs in benchmarks/triton_bench.py)
LOAD_REQUESTS = int(os.environ.get("KVEMBED_TRITON_LOAD_REQUESTS", "25"))
LOAD_CLIENTS = 32
MODELS = {"kv": "kv-embedding", "va": "va", "tp": "token-prepending"}
LOOPBACK = "127.0.0.1"


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def artifacts(stories_artifact):
    """The demo model exported with kv-embedding (+ an --also output), va and token-prepending
    (the session's shared exports: read-only here)."""
    return {
        "kv": stories_artifact("kv-embedding", also=("last=kv-embedding:pooling=last",)),
        "va": stories_artifact("va", layers="1-2"),
        "tp": stories_artifact("token-prepending"),
    }


@pytest.fixture(scope="module")
def oracles(artifacts):
    return {name: Embedder.load(path, provider="cpu") for name, path in artifacts.items()}


@pytest.fixture(scope="module")
def repositories(artifacts, tmp_path_factory):
    root = tmp_path_factory.mktemp("triton-repos")
    return {
        "main": write_repository([artifacts[n] for n in MODELS], root / "main", list(MODELS), warmup=True),
        "query": write_repository(artifacts["kv"], root / "query", "kvq", kind="query", instances=2, max_batch_size=8),
        "ort": write_repository(artifacts["kv"], root / "ort", "kvort", backend="onnxruntime", tensorrt_accelerator=True, fp16=True),
        "trt": write_repository(artifacts["kv"], root / "trt", "kvtrt", backend="tensorrt", preferred_batch_sizes=[16]),
        "ov": write_repository(artifacts["kv"], root / "ov", "kvov", provider="openvino", max_batch_tokens=256),
        "engine": write_repository(make_engine_dir(artifacts["kv"], root / "engine-dir", ENGINE_SHAPES), root / "engine",
                                   "kveng", backend="tensorrt", kind="query"),
    }


ENGINE_SHAPES = ("1x64:4x64:4x128", "1x129:2x200:2x256")  # every batch padded to >= 64 tokens, cut at 256


def stub_has_openvino() -> bool:
    return subprocess.run([str(stub_python()), "-c", "import openvino"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def server(repositories, tmp_path_factory):
    """One server on the python-backend repositories (the main one, the --kind query one, and the
    --provider openvino one where the stub environment has openvino)."""
    require_tritonserver()
    log_path = tmp_path_factory.mktemp("triton-log") / "tritonserver.log"
    served = [*MODELS, "kvq"]
    extra = [f"--model-repository={repositories['query']}"]
    if stub_has_openvino():
        extra.append(f"--model-repository={repositories['ov']}")
        served.append("kvov")
    extra += ["--model-control-mode=explicit", *(f"--load-model={name}" for name in served)]
    with open(log_path, "w") as log:
        instance = TritonServer(repositories["main"], python=stub_python(), log=log, extra_args=extra)
        instance.log_path = log_path
        try:
            with instance:
                yield instance
                code = instance.stop()
        except RuntimeError as err:
            raise RuntimeError(f"{err}: {log_path.read_text()[-3000:]}") from None
    assert code == 0, f"tritonserver exited with {code}"


@pytest.fixture
def connect(server):
    """``connect(protocol)`` -> a client of the server, closed after the test."""
    clients = Clients(server)
    yield clients
    clients.close()


# -- the repository on disk -----------------------------------------------------------------------


def test_configs_parse_back_with_model_config_pb2(repositories, artifacts):
    main = repositories["main"]
    for name, artifact in artifacts.items():
        manifest = read_manifest(artifact)
        dim = manifest["dim"]
        ensemble = read_config(main / name)
        assert ensemble.platform == "ensemble" and ensemble.max_batch_size == 64
        assert [(i.name, i.data_type, list(i.dims), i.optional) for i in ensemble.input] == [
            ("TEXT", mc.TYPE_STRING, [1], False), ("KIND", mc.TYPE_STRING, [1], True)]
        outputs = {o.name: (o.data_type, list(o.dims)) for o in ensemble.output}
        assert outputs["embedding"] == (mc.TYPE_FP32, [dim])
        assert set(outputs) == {"embedding", *(manifest.get("also") or {})}
        assert [step.model_name for step in ensemble.ensemble_scheduling.step] == [f"{name}_tokenize", f"{name}_model"]

        tokenize = read_config(main / f"{name}_tokenize")
        graph_inputs = [item["name"] for item in manifest["inputs"]]
        assert tokenize.backend == "python"
        assert [o.name for o in tokenize.output] == graph_inputs and all(list(o.dims) == [-1] for o in tokenize.output)
        assert tokenize.dynamic_batching.max_queue_delay_microseconds == 2000
        assert [(g.kind, g.count) for g in tokenize.instance_group] == [(mc.ModelInstanceGroup.KIND_CPU, 1)]
        assert [w.batch_size for w in tokenize.model_warmup] == [1, 64]
        assert (main / f"{name}_tokenize" / "warmup" / "text").is_file()

        model = read_config(main / f"{name}_model")
        assert model.backend == "python" and [i.name for i in model.input] == graph_inputs
        assert model.parameters["threads"].string_value == "1"
        assert all(i.allow_ragged_batch for i in model.input) and tokenize.parameters["padding"].string_value == "request"
        assert {o.name for o in model.output} == {o["name"] for o in manifest["outputs"] if o["name"].startswith("embedding")}
    assert "pool_mask" not in [o.name for o in read_config(main / "kv_tokenize").output]


def test_gpu_variant_configs(repositories, artifacts):
    ort = read_config(repositories["ort"] / "kvort_model")
    assert ort.platform == "onnxruntime_onnx" and ort.default_model_filename == "model.onnx"
    assert [list(i.dims) for i in ort.input] == [[-1], [-1]]
    (accelerator,) = ort.optimization.execution_accelerators.gpu_execution_accelerator
    assert accelerator.name == "tensorrt" and accelerator.parameters["precision_mode"] == "FP16"
    assert ort.parameters["intra_op_thread_count"].string_value == "1"
    assert not any(i.allow_ragged_batch for i in ort.input)  # equal widths: one tokenizer execution, one width
    assert read_config(repositories["ort"] / "kvort_tokenize").parameters["padding"].string_value == "execution"
    assert [g.kind for g in ort.instance_group] == [mc.ModelInstanceGroup.KIND_GPU]
    assert (repositories["ort"] / "kvort_model" / "1" / "model.onnx").read_bytes() == (artifacts["kv"] / "model.onnx").read_bytes()

    trt = read_config(repositories["trt"] / "kvtrt_model")
    assert trt.platform == "tensorrt_plan" and trt.default_model_filename == "model.plan"
    assert [(g.kind, list(g.profile)) for g in trt.instance_group] == [(mc.ModelInstanceGroup.KIND_GPU, ["0"])]
    script = (repositories["trt"] / "kvtrt_model" / "build_plan.sh").read_text()
    max_length = read_manifest(artifacts["kv"])["max_length"]
    assert f"--maxShapes=input_ids:64x{max_length},attention_mask:64x{max_length}" in script
    assert "--optShapes=input_ids:16x128" in script and "--fp16" not in script
    readme = (repositories["trt"] / "README.md").read_text()
    assert "NGC container" in readme and "build_plan.sh" in readme and "not exercise" in readme


def test_repository_readme_says_how_to_serve_and_query(repositories):
    readme = (repositories["main"] / "README.md").read_text()
    for needle in ("tritonserver --model-repository", "curl -s localhost:8000/v2/models/kv/infer", "tritonclient",
                   'pip install "numpy<2" onnxruntime tokenizers', "kvembed triton serve", "--host 0.0.0.0", "HTTP 400"):
        assert needle in readme


def test_copied_runtime_imports_in_the_stub_environment_without_kvembed(repositories):
    """The stub environment has no kvembed: the repository's own copy is all the models have."""
    require_tritonserver()
    python = str(stub_python())
    outside = {"capture_output": True, "text": True, "cwd": repositories["main"].parent}  # not the source tree
    assert subprocess.run([python, "-c", "import kvembed"], **outside).returncode != 0, (
        f"{python} has kvembed installed, so this test could not prove the repository is self-contained")
    version_dir = repositories["main"] / "tp_model" / "1"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import kvembed.runtime, kvembed.triton.rows; "
            "assert 'torch' not in sys.modules; print(kvembed.__file__)")
    result = subprocess.run([python, "-c", code, str(version_dir)], check=True, **outside)
    assert result.stdout.strip().startswith(str(version_dir))


def test_write_repository_refuses_bad_input(artifacts, tmp_path):
    with pytest.raises(ValueError, match="backend must be one of"):
        write_repository(artifacts["kv"], tmp_path / "a", backend="tflite")
    with pytest.raises(ValueError, match="outside 1..max_batch_size"):
        write_repository(artifacts["kv"], tmp_path / "a", max_batch_size=8, preferred_batch_sizes=[16])
    with pytest.raises(ValueError, match="collide"):
        write_repository([artifacts["kv"], artifacts["va"]], tmp_path / "a", ["x", "x"])
    with pytest.raises(ValueError, match="one name per artifact"):
        write_repository([artifacts["kv"], artifacts["va"]], tmp_path / "a", ["x"])
    with pytest.raises(FileNotFoundError, match="no artifact directory"):
        write_repository(tmp_path / "missing", tmp_path / "a")
    with pytest.raises(ValueError, match="provider must be one of"):
        write_repository(artifacts["kv"], tmp_path / "a", provider="rocm")
    with pytest.raises(ValueError, match="python-backend option"):
        write_repository(artifacts["kv"], tmp_path / "a", backend="onnxruntime", provider="openvino")
    with pytest.raises(ValueError, match="max_batch_tokens must be a positive integer"):
        write_repository(artifacts["kv"], tmp_path / "a", max_batch_tokens=0)
    with pytest.raises(TypeError, match="no option max_tokens; the options are backend, "):  # the old name of max_batch_tokens
        write_repository(artifacts["kv"], tmp_path / "a", max_tokens=256)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "file").write_text("x")
    with pytest.raises(FileExistsError, match="--force"):
        write_repository(artifacts["kv"], tmp_path / "full")
    with pytest.raises(NotADirectoryError, match="is a file"):  # --force never replaces a file
        write_repository(artifacts["kv"], tmp_path / "full" / "file", force=True)
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == ["file"]  # no file.partial left beside it
    assert not (tmp_path / "a").exists() and not (tmp_path / "a.partial").exists()


def test_weight_only_int8_is_refused_on_the_onnxruntime_backend_and_served_by_python(stories_artifact, tmp_path):
    """Triton's onnxruntime backend has no model-config key for the session entry that pins a
    weight-only int8 graph's arithmetic (it would run onnxruntime's default, not what the gate
    certified): refused in one line before anything is written; the python backend takes it."""
    # a copy: the repository hard-links the weights file, and onnx refuses to load external data
    # with several links, which the shared artifact's other readers would then meet
    int8 = shutil.copytree(stories_artifact("kv-embedding", "int8"), tmp_path / "int8")  # auto: weight-only
    with pytest.raises(ValueError, match="session.qdq_matmulnbits_accuracy_level=1.*--backend python") as error:
        write_repository(int8, tmp_path / "ort", backend="onnxruntime")
    assert "\n" not in str(error.value) and not (tmp_path / "ort").exists()
    repository = write_repository(int8, tmp_path / "py", "w8")
    assert read_config(repository / "w8_model").backend == "python"


def test_cli_build_and_its_one_line_errors(artifacts, tmp_path):
    from kvembed.cli.main import app

    runner = CliRunner()
    out = tmp_path / "repo"
    result = runner.invoke(app, ["triton", "build", str(artifacts["va"]), "--out", str(out), "--name", "v",
                                 "--kind", "document", "--preferred-batch-sizes", "4,8", "--max-batch-size", "8"])
    assert result.exit_code == 0, result.output
    tokenize = read_config(out / "v_tokenize")
    assert list(tokenize.dynamic_batching.preferred_batch_size) == [4, 8] and [i.name for i in tokenize.input] == ["TEXT"]
    for args, message in [
        (["--backend", "python", "--fp16"], "--fp16 applies to TensorRT"),
        (["--preferred-batch-sizes", "4,x"], "comma-separated integers"),
        (["--kind", "passage"], "kind must be one of"),
        (["--threads", "-1"], "threads must be an integer >= 0"),
    ]:
        result = runner.invoke(app, ["triton", "build", str(artifacts["va"]), "--out", str(tmp_path / "b"), *args])
        assert result.exit_code == 2, result.output
        assert message in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["triton", "serve", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "no model repository" in result.output
    result = runner.invoke(app, ["triton", "serve", str(artifacts["va"])])  # an artifact, not a repository
    assert result.exit_code == 2 and "is not a model repository" in result.output


def test_cli_serve_refuses_what_it_cannot_bind_in_one_line(repositories):
    """An address not on this machine (198.51.100.7 is TEST-NET-2), a port already listened on and
    one port for two services fail before tritonserver starts: exit 2, one line naming them; the
    caller's signal handlers are its own again afterwards (here: pytest's Ctrl-C)."""
    require_tritonserver()
    from kvembed.cli.main import app

    handlers = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    ports = Ports.free()
    serve = ["triton", "serve", str(repositories["query"]), "--python", str(stub_python())]
    with socket.socket() as taken:
        taken.bind((LOOPBACK, ports.http))
        taken.listen()
        for args, message in [
            (["--host", "198.51.100.7", "--http-port", str(ports.grpc)], f"cannot serve HTTP on 198.51.100.7:{ports.grpc}"),
            (["--http-port", str(ports.http)], f"cannot serve HTTP on 127.0.0.1:{ports.http}: Address already in use"),
            (["--grpc-port", "8000"], "HTTP, gRPC and metrics need three different ports"),
        ]:
            result = CliRunner().invoke(app, [*serve, *args])
            assert result.exit_code == 2, result.output
            assert message in " ".join(result.output.split()) and "Traceback" not in result.output, result.output
    assert {number: signal.getsignal(number) for number in handlers} == handlers


def test_row_helpers():
    assert decode_strings(np.array([[b"a"], ["b".encode()], ["é".encode()]], dtype=object), "TEXT") == ["a", "b", "é"]
    with pytest.raises(ValueError, match=r"TEXT\[1\] is not valid UTF-8"):
        decode_strings(np.array([[b"ok"], [b"\xc3\x28"]], dtype=object), "TEXT")
    right = {"input_ids": np.array([[5, 6, 7], [8, 0, 0]]), "attention_mask": np.array([[1, 1, 1], [1, 0, 0]]),
             "pool_mask": np.array([[0, 1, 1], [1, 0, 0]])}
    assert [(r.ids, r.pool) for r in unpad_rows(right)] == [((5, 6, 7), (1, 2)), ((8,), (0,))]
    left = {"input_ids": np.array([[0, 0, 9], [4, 3, 2]]), "attention_mask": np.array([[0, 0, 1], [1, 1, 1]])}
    assert [(r.ids, r.pool) for r in unpad_rows(left)] == [((9,), None), ((4, 3, 2), None)]
    parts = split_rows({"embedding": np.arange(10.0).reshape(5, 2)}, [2, 0, 3])
    assert [p["embedding"].tolist() for p in parts] == [[[0, 1], [2, 3]], [], [[4, 5], [6, 7], [8, 9]]]


# -- the real server ------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_ensemble_equals_the_runtime(server, connect, oracles, protocol):
    client = connect(protocol)
    for name, oracle in oracles.items():
        for kind in ("query", "document"):
            outputs = ["embedding", *(oracle.manifest.get("also") or {})]
            got = infer(client, protocol, name, TEXTS, kind=kind, outputs=outputs)
            for output in outputs:
                want = oracle.encode(TEXTS, kind=kind, output=None if output == "embedding" else output)
                assert_close(got[output], want, f"{name} {kind} {output}")
            one = infer(client, protocol, name, [TEXTS[0]], kind=kind)["embedding"]  # a batch of one
            assert_close(one, oracle.encode(TEXTS[:1], kind=kind), f"{name} {kind} single")
        # without KIND the ensemble embeds documents
        assert_close(infer(client, protocol, name, TEXTS[:3])["embedding"], oracle.encode(TEXTS[:3]), f"{name} default kind")


def test_warmup_ran_at_load(server, connect):
    client = connect("http")
    for name in MODELS:
        for model in (f"{name}_tokenize", f"{name}_model"):
            (stats,) = client.get_inference_statistics(model)["model_stats"]
            assert 64 in {int(b["batch_size"]) for b in stats["batch_stats"]}, (model, stats["batch_stats"])


def test_fixed_kind_repository(server, connect, oracles):
    """--kind query: no KIND input; every text embedded as a query (two instances)."""
    client = connect("grpc")
    assert [i.name for i in client.get_model_metadata("kvq").inputs] == ["TEXT"]
    assert_close(infer(client, "grpc", "kvq", TEXTS)["embedding"], oracles["kv"].encode(TEXTS, kind="query"), "kvq")
    with pytest.raises(InferenceServerException, match="KIND"):
        infer(client, "grpc", "kvq", TEXTS[:1], kind="query")


def test_openvino_provider_repository(server, connect, oracles, repositories):
    """--provider openvino --max-tokens 256: the graph model runs the copied runtime on OpenVINO."""
    config = read_config(repositories["ov"] / "kvov_model" / "config.pbtxt")
    assert config.parameters["provider"].string_value == "openvino"
    assert config.parameters["max_batch_tokens"].string_value == "256"
    assert "pip install \"numpy<2\" onnxruntime tokenizers openvino" in (repositories["ov"] / "README.md").read_text()
    if not stub_has_openvino():
        pytest.skip(f"the Triton stub environment {stub_python()} has no openvino (.ci/run installs it)")
    client = connect("grpc")
    got = infer(client, "grpc", "kvov", TEXTS, kind="query")["embedding"]
    want = oracles["kv"].encode(TEXTS, kind="query")
    worst = float(np.min(np.sum(got * want, axis=1)))  # unit rows; >= 0.999 allows the bf16 hint on BF16 CPUs
    assert got.shape == want.shape and worst >= 0.999, worst
    log = server.log_path.read_text()
    assert log.count("kvov_model: runs on openvino-") == 1  # the runtime's choice, said once


def test_gpu_variants_fail_only_for_the_missing_backend(repositories, artifacts, tmp_path):
    """The pip wheel's Triton has no onnxruntime/TensorRT backends: loading fails on exactly that,
    which means the config itself passed Triton's checks. (A server of its own: a failed load
    leaves a strict-readiness server not ready for good.) The engine repository's tokenizer loads
    and cuts/pads to the engine's profiles."""
    require_tritonserver()
    with open(tmp_path / "log", "w") as log, TritonServer(
        repositories["ort"], python=stub_python(), log=log,
        extra_args=[f"--model-repository={repositories['trt']}", f"--model-repository={repositories['engine']}",
                    "--model-control-mode=explicit"],
    ) as gpu_server:
        clients = Clients(gpu_server)
        client = clients("http")
        for model, backend in (("kvort_model", "onnxruntime"), ("kvtrt_model", "tensorrt"), ("kveng_model", "tensorrt")):
            with pytest.raises(InferenceServerException) as failure:
                client.load_model(model)
            assert f"unable to find backend library for backend '{backend}'" in failure.value.message(), failure.value.message()
        client.load_model("kveng_tokenize")
        encoder = encoder_from_manifest(artifacts["kv"], load_manifest(artifacts["kv"]))
        encoder.max_length = 256  # where the engine's profiles stop
        for text, width in (("hi", 64), ("word " * 400, 256)):
            ids = client.infer("kveng_tokenize", httpclient_input(text)).as_numpy("input_ids")
            want = encoder.encode([text], "query")[0].ids
            assert ids.shape[1] == width and list(ids[0][: len(want)]) == list(want), (ids.shape, len(want))
        assert client.is_server_live()
        clients.close()


def httpclient_input(text: str) -> list:
    import tritonclient.http as httpclient

    tensor = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
    return [tensor]


def test_dynamic_batching_merges_concurrent_requests(server, connect, oracles):
    """32 callers at once: the tokenizer runs batches of more than one request, and every caller
    gets its own row back."""
    texts = [f"caller {i} writes about topic number {i * 7 % 13}" for i in range(32)]
    want = oracles["va"].encode(texts)
    admin = connect("http")
    before = _batch_counts(admin, "va_tokenize")
    barrier = threading.Barrier(len(texts))

    def call(index: int) -> np.ndarray:
        client = connect("http")
        barrier.wait()
        return infer(client, "http", "va", [texts[index]])["embedding"][0]

    with ThreadPoolExecutor(len(texts)) as pool:
        got = np.stack(list(pool.map(call, range(len(texts)))))
    assert_close(got, want, "dynamic batching rows")
    after = _batch_counts(admin, "va_tokenize")
    merged = {size: after[size] - before.get(size, 0) for size in after if size > 1 and after[size] > before.get(size, 0)}
    assert merged, f"no execution with batch > 1: {after}"
    executed = sum(size * count for size, count in merged.items()) + after.get(1, 0) - before.get(1, 0)
    assert executed == len(texts)


def _batch_counts(client, model: str) -> dict[int, int]:
    (stats,) = client.get_inference_statistics(model)["model_stats"]
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}


def test_load_32_clients_every_response_checked(server, connect, oracles):
    """LOAD_CLIENTS clients (half HTTP, half gRPC) x LOAD_REQUESTS requests of 1-3 texts, query and
    document: every row compared with the runtime; nothing lost or mixed up; server healthy after."""
    pool_texts = [f"load text {i}: " + " ".join(["alpha", "beta", "gamma", "delta"][: 1 + i % 4]) * (1 + i % 5) for i in range(48)]
    want = {kind: oracles["kv"].encode(pool_texts, kind=kind) for kind in ("query", "document")}
    admin = connect("http")
    (before,) = admin.get_inference_statistics("kv")["model_stats"]

    def client_run(index: int) -> int:
        protocol = "http" if index % 2 else "grpc"
        client = connect(protocol)
        rows = 0
        for step in range(LOAD_REQUESTS):
            picks = [(index * 31 + step * 7 + k) % len(pool_texts) for k in range(1 + (index + step) % 3)]
            kind = ("query", "document")[(index + step) % 2]
            got = infer(client, protocol, "kv", [pool_texts[p] for p in picks], kind=kind)["embedding"]
            assert_close(got, want[kind][picks], f"client {index} request {step}")
            rows += len(picks)
        return rows

    with ThreadPoolExecutor(LOAD_CLIENTS) as pool:
        rows = sum(pool.map(client_run, range(LOAD_CLIENTS)))
    deadline = time.monotonic() + 15
    while True:  # Triton counts a request once its answer is out: the last few may land a moment after the client has them
        (after,) = admin.get_inference_statistics("kv")["model_stats"]
        success = int(after["inference_stats"]["success"]["count"]) - int(before["inference_stats"]["success"]["count"])
        failed = int(after["inference_stats"]["fail"]["count"]) - int(before["inference_stats"]["fail"]["count"])
        if success + failed >= LOAD_CLIENTS * LOAD_REQUESTS or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert (success, failed) == (LOAD_CLIENTS * LOAD_REQUESTS, 0)
    assert rows == sum(1 + (i + s) % 3 for i in range(LOAD_CLIENTS) for s in range(LOAD_REQUESTS))
    assert admin.is_server_ready() and admin.is_model_ready("kv")


def test_bad_input_gets_an_error_or_a_defined_embedding(server, connect, oracles):
    client = connect("http")
    kv = oracles["kv"]
    # empty, whitespace and a 200,000-character text: embedded exactly as the runtime does
    with pytest.warns(UserWarning, match="max_length"):
        want = kv.encode(["", "  \t ", LONG])
    assert_close(infer(client, "http", "kv", ["", "  \t ", LONG])["embedding"], want, "empty/whitespace/long")
    # errors answer the request, naming the problem
    for texts, kind, message in [
        ([b"ok", b"\xff\xfebroken"], None, r"TEXT\[1\] is not valid UTF-8"),
        (["fine"], "passage", r"KIND\[0\] is 'passage'; use one of query, document"),
        ([], None, "expected 1 string elements"),  # an empty batch: Triton refuses it before any model
    ]:
        with pytest.raises(InferenceServerException, match=message):
            infer(client, "http", "kv", texts, kind=kind)
    # token-prepending refuses a text holding its placeholder, as the runtime does
    with pytest.raises(ValueError, match="<PST>"):
        oracles["tp"].encode(["a <PST> b"])
    with pytest.raises(InferenceServerException, match="<PST>"):
        infer(client, "http", "tp", ["a <PST> b"])
    # bad requests merged with good ones fail alone
    texts = [f"good request {i}" for i in range(12)]
    want = kv.encode(texts)

    def call(index: int):
        caller = connect("http")
        if index % 2:
            with pytest.raises(InferenceServerException, match="UTF-8"):
                infer(caller, "http", "kv", [b"\xc3\x28"])
        return infer(caller, "http", "kv", [texts[index]])["embedding"][0]

    with ThreadPoolExecutor(len(texts)) as pool:
        assert_close(np.stack(list(pool.map(call, range(len(texts))))), want, "good rows beside bad requests")
    assert client.is_server_ready() and all(client.is_model_ready(m) for m in [*MODELS, "kvq"])


#: a caller's mistakes through the ensemble: (model, texts, KIND, the message it names)
CLIENT_MISTAKES = [
    ("kv", ["fine"], "foo", r"KIND\[0\] is 'foo'; use one of query, document"),
    ("kv", [b"ok", b"\xff\xfebroken"], None, r"TEXT\[1\] is not valid UTF-8"),
    ("tp", ["a <PST> b"], None, "<PST>"),
]
STATUS = {"http": ("400", "500"), "grpc": ("StatusCode.INVALID_ARGUMENT", "StatusCode.INTERNAL")}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_client_mistakes_are_400_and_server_faults_500(server, connect, protocol):
    """A bad KIND, invalid UTF-8 or a text holding <PST> is the caller's mistake: HTTP 400 / gRPC
    INVALID_ARGUMENT with the reason, through the ensemble. A failure inside the graph model (here
    a token id past the vocabulary, sent to ``kv_model`` directly) stays a server fault: 500 / INTERNAL."""
    client, (mistake, fault) = connect(protocol), STATUS[protocol]
    for model, texts, kind, message in CLIENT_MISTAKES:
        with pytest.raises(InferenceServerException, match=message) as failure:
            infer(client, protocol, model, texts, kind=kind)
        assert failure.value.status() == mistake, (model, texts, kind, failure.value.status(), failure.value.message())
    with pytest.raises(InferenceServerException) as failure:
        infer_tokens(client, protocol, "kv_model", np.array([[1, 10**9]], dtype=np.int64))
    assert failure.value.status() == fault, failure.value.message()


def infer_tokens(client, protocol: str, model: str, ids: np.ndarray):
    """Call a graph model directly with ``ids`` (attention mask all ones)."""
    module = client_module(protocol)
    inputs = []
    for name, array in (("input_ids", ids), ("attention_mask", np.ones_like(ids))):
        tensor = module.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return client.infer(model, inputs)


def test_bad_kind_over_plain_http_is_a_400_with_the_reason(server):
    """What a curl user sees: the KServe JSON request with KIND "foo" answers 400 and a JSON error."""
    import http.client
    import json

    body = {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["hello"]},
                       {"name": "KIND", "shape": [1, 1], "datatype": "BYTES", "data": ["foo"]}]}
    host, port = server.http_url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=30)
    try:
        connection.request("POST", "/v2/models/kv/infer", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        status, answer = response.status, json.loads(response.read())
    finally:
        connection.close()
    assert status == 400, (status, answer)
    assert "KIND[0] is 'foo'; use one of query, document" in answer["error"], answer


def test_server_listens_on_loopback_only_by_default(server):
    """TritonServer binds HTTP, gRPC and metrics to 127.0.0.1 alone (tritonserver's own default
    is every interface), as the kernel's socket tables show."""
    ports = server.ports
    assert listening_sockets(server.process.pid) == {(LOOPBACK, port) for port in (ports.http, ports.grpc, ports.metrics)}


@contextlib.contextmanager
def cli_serve(repository: Path, log_path: Path, *options: str):
    """``kvembed triton serve REPOSITORY OPTIONS`` until its ready line; yields (process, its
    tritonserver's pid); then SIGTERM, which must end it with exit code 0."""
    command = [sys.executable, "-m", "kvembed.cli", "triton", "serve", str(repository), *options]
    env = dict(os.environ, KVEMBED_TRITON_PYTHON=str(stub_python()))
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=log_path.parent)
        try:
            deadline = time.monotonic() + HANG_GUARD_S
            while "Triton ready" not in log_path.read_text():
                assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()[-2000:]
                time.sleep(0.25)
            (triton,) = [pid for pid in child_pids(process.pid) if "tritonserver" in _cmdline(pid)]
            yield process, triton
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(90)
    assert code == 0, log_path.read_text()[-2000:]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # gone meanwhile
        return ""


def _port_options(ports: Ports) -> list[str]:
    return ["--http-port", str(ports.http), "--grpc-port", str(ports.grpc), "--metrics-port", str(ports.metrics)]


def test_cli_serve_runs_a_copied_repository(repositories, oracles, tmp_path):
    """``kvembed triton serve`` on a copy of a repository (moved away from where it was written),
    queried over HTTP, stopped by SIGTERM with exit code 0. By default it listens on 127.0.0.1
    only (HTTP, gRPC and metrics), and its ready line names exactly the sockets it listens on."""
    require_tritonserver()
    import tritonclient.http as httpclient

    moved = shutil.copytree(repositories["query"], tmp_path / "elsewhere" / "repo")
    ports = Ports.free()
    log_path = tmp_path / "serve.log"
    with cli_serve(moved, log_path, *_port_options(ports)) as (_, triton):
        bound = listening_sockets(triton)
        assert bound == {(LOOPBACK, port) for port in (ports.http, ports.grpc, ports.metrics)}, bound
        assert announced_endpoints(log_path.read_text()) == bound, log_path.read_text()[-2000:]
        client = httpclient.InferenceServerClient(f"{LOOPBACK}:{ports.http}")
        try:
            got = infer(client, "http", "kvq", TEXTS[:3])["embedding"]
        finally:
            client.close()
        assert_close(got, oracles["kv"].encode(TEXTS[:3], kind="query"), "served copy")


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("host", ["127.0.0.2", "::1"])
def test_cli_serve_listens_where_host_says(repositories, oracles, tmp_path, host):
    """``--host``: HTTP, gRPC and metrics listen on that address alone, the ready line says so, a
    client reaches it there and not on 127.0.0.1. (127.0.0.2 is on lo's 127/8 too and ::1 is
    IPv6's loopback: the test exposes nothing beyond this machine.)"""
    require_tritonserver()
    if ":" in host and not has_ipv6_loopback():
        pytest.skip("this machine has no IPv6 loopback")
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    repository = shutil.copytree(repositories["query"], tmp_path / "repo")
    ports = Ports.free()
    log_path = tmp_path / "serve.log"
    with cli_serve(repository, log_path, "--host", host, *_port_options(ports)) as (_, triton):
        bound = listening_sockets(triton)
        assert bound == {(host, port) for port in (ports.http, ports.grpc, ports.metrics)}, bound
        assert announced_endpoints(log_path.read_text()) == bound, log_path.read_text()[-2000:]
        url = f"[{host}]" if ":" in host else host
        http, grpc = httpclient.InferenceServerClient(f"{url}:{ports.http}"), grpcclient.InferenceServerClient(f"{url}:{ports.grpc}")
        try:
            assert_close(infer(http, "http", "kvq", TEXTS[:2])["embedding"], oracles["kv"].encode(TEXTS[:2], kind="query"), host)
            assert grpc.is_server_live()
        finally:
            http.close()
            grpc.close()
        with socket.socket() as probe:
            assert probe.connect_ex((LOOPBACK, ports.http)) != 0, "the server also answers on 127.0.0.1"


def test_cli_serve_stopped_while_loading_exits_cleanly(repositories, tmp_path):
    """SIGTERM while Triton is still loading the models: ``kvembed triton serve`` exits 0, as a
    supervisor expects, and leaves nothing running: not the server (its HTTP port is free) and
    not a python-backend stub (they outlive a server stopped mid-load unless killed)."""
    require_tritonserver()
    private = shutil.copytree(repositories["query"], tmp_path / "repo")  # its path names this test's processes
    ports = Ports.free()
    command = [sys.executable, "-m", "kvembed.cli", "triton", "serve", str(private), *_port_options(ports)]
    env = dict(os.environ, KVEMBED_TRITON_PYTHON=str(stub_python()))
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
        try:
            deadline = time.monotonic() + HANG_GUARD_S
            while "loading: " not in log_path.read_text():  # Triton has begun loading models
                assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()[-2000:]
                time.sleep(0.05)
            assert "Triton ready" not in log_path.read_text()
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(90)
    assert code == 0, log_path.read_text()[-2000:]
    with socket.socket() as probe:
        assert probe.connect_ex((LOOPBACK, ports.http)) != 0, "tritonserver outlived kvembed triton serve"
    assert _processes_naming(private) == [], "processes of the stopped server are still running"


def _processes_naming(path) -> list[str]:
    """Command lines of running processes that mention ``path``."""
    lines = (_cmdline(int(entry.name)) for entry in Path("/proc").iterdir() if entry.name.isdigit())
    return [line for line in lines if str(path) in line]


def test_models_ran_the_copied_runtime_and_no_stub_died(server, repositories):
    log = server.log_path.read_text()
    for name in MODELS:
        for model in (f"{name}_tokenize", f"{name}_model"):
            assert f"{model}: kvembed runtime from {repositories['main'] / model / '1' / 'kvembed'}" in log
    for marker in ("is not healthy", "Stub process", "Segmentation fault", "Traceback"):
        assert marker not in log, marker
    assert server.alive()
