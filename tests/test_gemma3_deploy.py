"""Gemma 3 deployed: every method of a tiny random Gemma 3 (sliding-window and global layers, texts
longer than the window) exported at fp16 (int8 and fp32 where the Gemma-specific paths are) through the parity gate, then run by the
torch-free runtime on onnxruntime and OpenVINO, by ``kvembed serve`` (the official ``openai``
client over a socket) and by a real Triton server, each checked against the independent oracle
(tests/independent.py) within METHODS.md's tolerance of the artifact's precision.

Few traces: methods whose forward passes coincide ride along as ``--also`` outputs (each passes
its own gate), so six traces give every method, and the token-prepending artifact carries four
early exits: the last layer run a sliding one or a global one, with ``<PST>`` beyond the window.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import torch

from checks import MIN_COSINE, assert_same
from independent import Oracle
from kvembed import OpenVINOOptions
from kvembed.runtime import Embedder, read_manifest
from test_gemma3 import LAYER_TYPES, LONG, WINDOW, build_tiny_gemma3

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: every export at fp16; int8 for the Gemma-specific paths (the re-routed prefix, <PST>: int8's recipes
#: are the same on every family, tests/test_int8*.py); fp32 only where a test below reads it (the fp32
#: exports of kv-embedding and token-prepending are tests/test_gemma3.py's)
PRECISIONS = ("fp16", "int8")
INT8 = ("kv", "tp")
FP32 = ("tp",)


def precisions_of(name: str) -> tuple[str, ...]:
    """The precisions export ``name`` is written at."""
    return ("fp16", *(("int8",) if name in INT8 else ()), *(("fp32",) if name in FP32 else ()))
TP = {"tp_start": 0, "tp_stop": 3}
KV = {"layers": "1-3", "num_prefix": 3, "bias": 2.5, "prefix_rope": "zero"}


def _also(label: str, method: str, **options: Any) -> str:
    return ":".join([f"{label}={method}", *(f"{k}={v}" for k, v in options.items())])


#: per-layer-type names of the token-prepending exits: the last layer run (exit_layer - 1) is ...
TP_EXITS = {None: 4, "global": 5, "first": 1, "second": 2}  # ... layer 3, 4, 0, 1: S, F, S, F
#: artifact -> (main method, its options, {output label: (method, options)} of its --also outputs)
EXPORTS: dict[str, tuple[str, dict[str, Any], dict[str, tuple[str, dict[str, Any]]]]] = {
    "raw": ("last-token", {}, {"mean": ("mean", {}), "va": ("va", {"layers": "0,2"})}),
    "kv": ("kv-embedding", KV, {"last": ("kv-embedding", {**KV, "pooling": "last"}),
                                "mean": ("kv-embedding", {**KV, "pooling": "mean"})}),
    "awva": ("aligned-wva", {"layers": "1-3"}, {"wva": ("aligned-wva", {"layers": "2-4", "wva": True})}),
    "tp": ("token-prepending", {**TP, "exit_layer": TP_EXITS[None]},
           {label: ("token-prepending", {**TP, "exit_layer": e}) for label, e in TP_EXITS.items() if label}),
    "prompteol": ("prompteol", {}, {}),
    "echo": ("echo", {}, {}),
}
#: every (artifact, output label or None, method, oracle options): each method of METHODS.md
OUTPUTS = [(name, None, method, options) for name, (method, options, _) in EXPORTS.items()] + [
    (name, label, method, options) for name, (_, _, extra) in EXPORTS.items() for label, (method, options) in extra.items()
]
OUTPUT_IDS = [f"{name}-{label or 'main'}" for name, label, _, _ in OUTPUTS]


def kinds_of(method: str) -> tuple[str, ...]:
    """Only kv-embedding prompts queries and documents differently."""
    return ("document", "query") if method == "kv-embedding" else ("document",)


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def gemma3_folder(tmp_path_factory) -> Path:
    """tests/test_gemma3.py's tiny Gemma 3 (its config), other random weights."""
    return build_tiny_gemma3(tmp_path_factory.mktemp("gemma3-deploy") / "model", seed=11)


@pytest.fixture(scope="session")
def gemma3_oracle(gemma3_folder) -> Oracle:
    return Oracle(gemma3_folder)


@pytest.fixture(scope="session")
def want(gemma3_oracle):
    """``want(method, kind, **options)`` -> the oracle's rows for LONG, computed once."""
    made: dict[tuple, np.ndarray] = {}

    def get(method: str, kind: str = "document", **options: Any) -> np.ndarray:
        key = (method, kind, tuple(sorted(options.items())))
        if key not in made:
            made[key] = np.stack([gemma3_oracle.embed(method, text, kind, **options) for text in LONG])
        return made[key]

    return get


@pytest.fixture(scope="session")
def gemma3_artifacts(traces, gemma3_folder, tmp_path_factory) -> dict[tuple[str, str], Path]:
    """(export name, precision) -> its artifact: one trace per export, three precisions from it;
    each write passed the exporter's parity gate (it raises otherwise). Read-only."""
    root = tmp_path_factory.mktemp("gemma3-artifacts")
    made = {}
    for name, (method, options, extra) in EXPORTS.items():
        also = tuple(_also(label, m, **o) for label, (m, o) in extra.items())
        exporter = traces.get(gemma3_folder, method, **options, **({"also": also} if also else {}))
        for precision in precisions_of(name):
            made[name, precision] = exporter.write(root / f"{name}-{precision}", precision).path
    return made


@pytest.fixture(scope="module")
def runtimes(gemma3_artifacts):
    """(export name, precision, provider, OpenVINO hint) -> a loaded Embedder, loaded once."""
    loaded: dict[tuple, Embedder] = {}

    def get(name: str, precision: str, provider: str = "cpu", hint: str | None = None) -> Embedder:
        key = (name, precision, provider, hint)
        if key not in loaded:
            options = OpenVINOOptions(precision=hint) if provider == "openvino" else None
            loaded[key] = Embedder.load(gemma3_artifacts[name, precision], provider=provider, threads=1, options=options)
        return loaded[key]

    return get


# -- the model really runs past its window -------------------------------------------------------


def test_every_prompt_runs_past_the_window_and_pst_is_beyond_the_last_tokens_reach(gemma3_oracle):
    """The premise of the tests below: each token-prepending prompt is longer than the window, with
    <PST> more than a window before the last token; and the exits' last layers are of both kinds."""
    assert {"sliding_attention", "full_attention"} == set(gemma3_oracle.config["layer_types"])
    for text in LONG:
        tokens = gemma3_oracle.tokenize("token-prepending", text)
        assert len(tokens.ids) - 1 - tokens.pst_index >= WINDOW, text
    last_run = {label: LAYER_TYPES[exit_layer - 1] for label, exit_layer in TP_EXITS.items()}
    assert last_run == {None: "sliding_attention", "global": "full_attention",
                        "first": "sliding_attention", "second": "full_attention"}


# -- exports: the gate at every precision, the runtime against the oracle -----------------------


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_export_passed_its_gate_with_every_output(gemma3_artifacts, precision):
    """The manifest records the gate's worst cosine of the main output and of each --also output,
    each within METHODS.md's bound; int8 records the recipe the exporter settled on."""
    for name, (method, _, extra) in EXPORTS.items():
        if precision not in precisions_of(name):
            continue
        manifest = read_manifest(gemma3_artifacts[name, precision])
        assert manifest["method"]["name"] == method and manifest["precision"] == precision
        reports = {None: manifest["parity"], **manifest["parity"].get("also", {})}
        assert set(reports) == {None, *extra}, name
        for label, report in reports.items():
            assert report["passed"] and report["worst_cosine"] >= MIN_COSINE[precision], (name, label, report)
        if precision == "int8":
            tried = manifest["graph"]["precision_conversion"]["recipes_tried"]
            assert tried[-1]["passed"], tried


@pytest.mark.parametrize(
    "name,label,method,options,precision",
    [(*output, p) for output in OUTPUTS for p in precisions_of(output[0])],
    ids=[f"{i}-{p}" for i, output in zip(OUTPUT_IDS, OUTPUTS) for p in precisions_of(output[0])],
)
def test_runtime_matches_the_oracle(runtimes, want, name, label, method, options, precision):
    """Embedder.load (onnxruntime, no torch in its path) on texts longer than the window, in padded
    batches of mixed lengths, against the oracle within the precision's tolerance."""
    embedder = runtimes(name, precision)
    for kind in kinds_of(method):
        got = embedder.encode(LONG, kind=kind, batch_size=4, output=label)
        assert_same(got, want(method, kind, **options), precision, f"{name}/{label} {precision} {kind}")


# -- OpenVINO ------------------------------------------------------------------------------------


#: (artifact precision, OpenVINO precision hint, METHODS.md tolerance) -> the exports run: every
#: fp16 one under both hints, the int8 and fp32 ones of the Gemma-specific paths (prefix, <PST>)
OPENVINO = {("fp16", "f32", "fp16"): tuple(EXPORTS), ("fp16", "bf16", "fp16"): tuple(EXPORTS),
            ("int8", "f32", "int8"): INT8, ("fp32", "f32", "fp32"): FP32}


@pytest.mark.parametrize("precision,hint,bound", list(OPENVINO), ids=[f"{p}-{h}" for p, h, _ in OPENVINO])
def test_openvino_runs_the_gemma3_artifacts(runtimes, want, precision, hint, bound):
    """provider="openvino" compiles the artifacts (grouped-query attention mended, sliding-window
    masks as exported) and matches the oracle within the artifact's tolerance, the bf16 hint
    within METHODS.md's bf16 one (0.999)."""
    pytest.importorskip("openvino", reason="the OpenVINO backend needs the openvino package (pip install 'kvembed[openvino]')")
    from kvembed.backends.openvino import PRECISIONS as HINTS

    if hint not in HINTS:  # pragma: no cover - the catalogue decides which hints exist
        pytest.skip(f"the OpenVINO backend offers no {hint} hint ({HINTS})")
    from kvembed.backends.cpu import cpu_features

    ran = hint if cpu_features().runs(hint) else "f32"  # a CPU without BF16 runs the bf16 hint in f32, and says so
    for name, label, method, options in (output for output in OUTPUTS if output[0] in OPENVINO[precision, hint, bound]):
        embedder = runtimes(name, precision, "openvino", hint)
        assert embedder.target == f"openvino-{ran}"
        for kind in kinds_of(method):
            got = embedder.encode(LONG, kind=kind, batch_size=4, output=label)
            assert_same(got, want(method, kind, **options), bound, f"openvino {hint} {name}/{label} {precision} {kind}")


# -- token prepending, <PST> and the sliding window ---------------------------------------------


def test_a_sliding_exit_cannot_see_pst_past_the_window(runtimes, want, gemma3_oracle):
    """METHODS.md's Gemma 3 note: rewiring copies the last token's state into <PST> whatever their
    distance, but in a sliding layer the last token attends only to the window before it. With
    layer 0 (sliding) the only layer run, <PST> lies outside the last token's window, so the
    embedding is the one without any rewiring at all; one global layer later it is not."""
    unrewired = {
        exit_layer: np.stack([gemma3_oracle.embed("token-prepending", t, tp_start=0, tp_stop=0, exit_layer=exit_layer) for t in LONG])
        for exit_layer in (1, 2)
    }
    embedder = runtimes("tp", "fp32")
    first = embedder.encode(LONG, batch_size=4, output="first")
    assert_same(first, unrewired[1], "fp32", "exit after sliding layer 0: <PST> unseen")
    second = embedder.encode(LONG, batch_size=4, output="second")
    assert_same(second, want("token-prepending", **TP, exit_layer=2), "fp32", "exit after global layer 1")
    moved = np.sum(second * unrewired[2], axis=1)  # unit rows: cosines
    assert float(moved.max()) < MIN_COSINE["fp32"], f"the global layer reads <PST> in every row: {moved}"


def test_the_reference_at_sliding_and_global_exits_padded_left(gemma3_folder, want):
    """The PyTorch reference (what the gate compares against), padded on the side the artifacts
    are not: exit_layer 3 ends on sliding layer 2 with every rewired layer run, 5 on global layer 4."""
    from kvembed.modeling.reference import TorchEmbedder

    for exit_layer in (3, 5):
        emb = TorchEmbedder.from_pretrained(gemma3_folder, "token-prepending", **TP, exit_layer=exit_layer)
        emb.padding_side = "left"
        got = emb.encode(LONG, batch_size=4)
        assert_same(got, want("token-prepending", **TP, exit_layer=exit_layer), "fp32", f"reference exit {exit_layer}")


# -- kvembed serve --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma3_server(gemma3_artifacts, tmp_path_factory):
    from kvembed.bench.served import ServerProcess

    args = [f"kv={gemma3_artifacts['kv', 'fp16']}", f"tp={gemma3_artifacts['tp', 'int8']}"]
    process = ServerProcess(args, tmp_path_factory.mktemp("gemma3-serve") / "server.log")
    yield process.wait_healthy()
    process.stop()


def test_serve_answers_the_openai_client(gemma3_server, want):
    """``kvembed serve`` on Gemma 3 artifacts (fp16 kv-embedding, int8 token-prepending): the official
    client's base64 and float answers equal the oracle within each artifact's precision."""
    client = openai.OpenAI(base_url=f"{gemma3_server.url}/v1", api_key="unused", max_retries=0)
    queries = client.embeddings.create(model="kv", input=LONG, extra_body={"input_type": "query"})
    assert [item.index for item in queries.data] == list(range(len(LONG)))
    assert_same(np.array([item.embedding for item in queries.data]), want("kv-embedding", "query", **KV), "fp16", "serve kv query")
    documents = client.embeddings.create(model="kv", input=LONG, encoding_format="float")
    assert_same(np.array([item.embedding for item in documents.data]), want("kv-embedding", **KV), "fp16", "serve kv")
    tp = client.embeddings.create(model="tp", input=LONG)
    assert tp.model == "tp" and tp.usage.prompt_tokens > len(LONG) * WINDOW
    assert_same(np.array([item.embedding for item in tp.data]), want("token-prepending", **TP, exit_layer=4), "int8", "serve tp")


# -- Triton ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma3_triton(gemma3_artifacts, tmp_path_factory):
    """``kvembed triton build`` of two Gemma 3 artifacts, served by the real tritonserver."""
    from triton_util import require_tritonserver, stub_python
    from typer.testing import CliRunner

    from kvembed.cli.main import app
    from kvembed.triton.server import TritonServer

    require_tritonserver()
    root = tmp_path_factory.mktemp("gemma3-triton")
    result = CliRunner().invoke(app, ["triton", "build", str(gemma3_artifacts["tp", "fp32"]), str(gemma3_artifacts["kv", "int8"]),
                                      "--out", str(root / "repo"), "--name", "gtp", "--name", "gkv"])
    assert result.exit_code == 0, result.output
    log_path = root / "tritonserver.log"
    with open(log_path, "w") as log:
        try:
            with TritonServer(root / "repo", python=stub_python(), log=log) as server:
                yield server
                code = server.stop()
        except RuntimeError as err:
            raise RuntimeError(f"{err}: {log_path.read_text()[-3000:]}") from None
    assert code == 0, f"tritonserver exited with {code}"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_triton_serves_gemma3_embeddings(gemma3_triton, want, protocol):
    """The ensemble (tokenizer + graph in the python backend's copied runtime) answers every
    output of the token-prepending repository and both kinds of the int8 kv-embedding one."""
    from kvembed.triton.client import infer
    from triton_util import Clients

    clients = Clients(gemma3_triton)
    try:
        client = clients(protocol)
        outputs = ["embedding", *(label for label in EXPORTS["tp"][2])]
        got = infer(client, protocol, "gtp", LONG, outputs=outputs)
        for output in outputs:
            exit_layer = TP_EXITS[None if output == "embedding" else output]
            assert_same(got[output], want("token-prepending", **TP, exit_layer=exit_layer), "fp32", f"triton tp {output}")
        for kind in ("query", "document"):
            got = infer(client, protocol, "gkv", LONG, kind=kind)["embedding"]
            assert_same(got, want("kv-embedding", kind, **KV), "int8", f"triton kv {kind}")
    finally:
        clients.close()
