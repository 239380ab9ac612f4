"""Shared fixtures: tiny random models of every supported architecture, the demo model, the
independent oracle of each, and the demo model's exported artifacts.

Tiny models are built from transformers configs, given non-trivial norm weights (so Qwen3's
q_norm/k_norm matter), random q/k/v biases (Qwen2) and a larger init scale (so attention is not
flat), saved with ``save_pretrained`` and reloaded from the folder like any user model. They
share the demo model's byte-level tokenizer. The tiny Mistral's sliding window (16 tokens) is
shorter than most test prompts, so every Mistral test runs beyond it. The tiny Granite's three
multipliers are away from 1 and its q/k/v/o and MLP biases on; the tiny OLMo 2 has random q/k
norm weights over the whole projection and random post-sublayer norms; the tiny Phi-3 fuses
q/k/v and gate/up and turns half of each head with RoPE; the tiny StableLM has LayerNorms with
random biases, q/k/v biases and RoPE on its default quarter of each head; the tiny Cohere runs
attention and MLP side by side on one LayerNorm, turns adjacent RoPE pairs and has its
attention biases on.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch

from independent import Oracle
from kvembed.artifact import MANIFEST
from kvembed.methods import demo_model_path

ARCHITECTURES = ("llama", "qwen3", "qwen2", "mistral", "granite", "olmo2", "phi3", "stablelm", "cohere", "gemma2")
#: the tiny Mistral's attention window, in tokens (the prompts of TEXTS are longer)
MISTRAL_WINDOW = 16
SHARED = Path(__file__).resolve().parents[1].parent / "shared"
LLAMA2_TOKENIZER = SHARED / "models" / "llama2-tokenizer"

TEXTS = [
    "A man is playing a guitar.",
    "hi",
    "The quick brown fox jumps over the lazy dog while the cat watches from the warm windowsill.",
    "Ünïcödé — 東京 🎉 works?",
    "Why is the sky blue?",
    'She said "no" twice.',
]


#: a CPU without avx512_bf16 / amx_bf16, stated with KVEMBED_CPU_FEATURES (the product's override of its probe)
NO_BF16 = "avx2,avx512f"
#: seconds a test waits for a process it started to reach a point (a run's first shards, a server's
#: ready line) before calling it hung: a guard against hanging forever, never a speed bound (on a
#: loaded 2-core host, a Ray run took over 120 s to write its second shard)
HANG_GUARD_S = 900
#: texts no parity gate decides on (kvembed/export/gate/texts.py holds the gate's)
UNSEEN = ["The river froze early that winter.", "Quarterly revenue rose four percent", "¿Dónde está la biblioteca?",
          "def f(x): return x * 2", "a"]


def unit(rows: "np.ndarray") -> "np.ndarray":
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def bf16_cpu():
    """Skips a module that needs a CPU with BF16 (the no-BF16 paths are stated with NO_BF16)."""
    from kvembed.backends.cpu import cpu_features

    if not cpu_features().bf16:
        pytest.skip("this CPU has no BF16 (the no-BF16 paths are tested by stating one with KVEMBED_CPU_FEATURES)")


#: set by the process that made the test cache, so pytest-xdist's workers (which inherit the
#: environment) share it instead of each making, and filling, its own
CACHE_OWNER = "KVEMBED_TEST_CACHE_OWNER"
#: where :func:`stories_artifact` keeps the demo model's artifacts for the whole run, made by the same
#: process: pytest-xdist's workers share them (one exports an artifact, the other reads it)
SHARED_ARTIFACTS = "KVEMBED_TEST_ARTIFACTS"


def pytest_configure(config: pytest.Config) -> None:
    """kvembed's cache (compiled OpenVINO blobs, dequantized GGUF) goes to a fresh directory, so
    tests neither read what an earlier run left in ~/.cache nor leave their artifacts' blobs there.
    One directory per run: pytest-xdist's workers use the one their controller made (a GGUF is
    dequantized once, not once per worker; the cache is made for concurrent fills).

    Piped status lines (``KVEMBED_STATUS_AFTER``) are off: a step announces itself when it runs
    past a time, so on a loaded machine a failing command's stderr would hold a status line or not
    by chance. tests/test_cli_output.py turns them on where the announcements are what it checks."""
    os.environ["KVEMBED_STATUS_AFTER"] = "inf"
    if not hasattr(config, "workerinput") and config.getoption("dist", None) == "loadgroup":
        config.pluginmanager.register(OneWorkerPerGroup(), "kvembed-one-worker-per-group")
    if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get(CACHE_OWNER):
        return
    os.environ["KVEMBED_CACHE_DIR"] = config._kvembed_cache = tempfile.mkdtemp(prefix="kvembed-test-cache-")
    os.environ[SHARED_ARTIFACTS] = config._kvembed_shared = tempfile.mkdtemp(prefix="kvembed-test-artifacts-")
    os.environ[CACHE_OWNER] = str(os.getpid())


#: the Triton python-backend stub's environment: the wheel's stub is built against numpy 1 and the
#: system libpython3.11, so its models run in a venv of the system Python 3.11 with numpy<2
TRITON_STUB_VENV = Path(__file__).resolve().parents[1] / ".venv-triton"
TRITON_STUB_PACKAGES = ("numpy<2", "onnxruntime", "tokenizers", "openvino")
#: the test files that start a real tritonserver (and so need the stub environment)
TRITON_TEST_FILES = ("test_triton.py", "test_gemma3_deploy.py", "test_big_artifacts.py")


#: test files that must not run beside each other under pytest-xdist (README's test command runs
#: two workers): each starts a local Ray cluster or a tritonserver, each sized for the whole machine
SERIAL_FILES = ("test_corpus.py", *TRITON_TEST_FILES)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (``--dist loadgroup``)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests for pytest-xdist: a file's tests on one worker (its module fixtures, an
    export or a server, are made once), the files of :data:`SERIAL_FILES` all on one. Then build
    .venv-triton (the README's test command is all a new machine runs) when Triton tests are collected."""
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of(item.path)))
    wanted = any(item.path.name in TRITON_TEST_FILES for item in items)
    if wanted:
        build_triton_stub_venv()


def group_of(path: Path) -> str:
    """The pytest-xdist group of a test file's tests (see :func:`pytest_collection_modifyitems`)."""
    return "serial" if path.name in SERIAL_FILES else path.name


class OneWorkerPerGroup:
    """Fails the run (controller side) when a group's tests ran on more than one worker: the
    grouping is what keeps a file's module fixtures made once and the Ray and Triton files apart,
    and a pytest that pytest-xdist does not support drops it silently."""

    def __init__(self) -> None:
        self.workers: dict[str, set[str]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = getattr(report, "node", None)
        if node is not None and report.when == "call":
            group = group_of(Path(report.fspath))
            self.workers.setdefault(group, set()).add(node.gateway.id)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        split = sorted(group for group, workers in self.workers.items() if len(workers) > 1)
        if split:
            writer = session.config.get_terminal_writer()
            writer.line()
            writer.line(
                f"pytest-xdist split the groups {', '.join(split)} across workers (pytest {pytest.__version__}): "
                "install what the test extra pins (pip install -e '.[test]')", red=True)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def build_triton_stub_venv() -> None:
    """.venv-triton, unless tritonserver is absent or a stub Python is named; built beside and renamed
    when complete (a failed build leaves no half venv), under a lock: every pytest-xdist worker
    collects the Triton tests, one builds."""
    import fcntl
    import importlib.util
    import subprocess

    if os.environ.get("KVEMBED_TRITON_PYTHON") or importlib.util.find_spec("pytriton") is None:
        return
    python = TRITON_STUB_VENV / "bin" / "python"
    with open(TRITON_STUB_VENV.with_name(TRITON_STUB_VENV.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not python.is_file():
            base = os.environ.get("KVEMBED_TRITON_BASE_PYTHON", "/usr/bin/python3.11")
            partial = TRITON_STUB_VENV.with_name(TRITON_STUB_VENV.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            subprocess.run([base, "-m", "venv", str(partial)], check=True)
            subprocess.run([str(partial / "bin" / "python"), "-m", "pip", "install", "-q", *TRITON_STUB_PACKAGES], check=True)
            partial.rename(TRITON_STUB_VENV)
    os.environ["KVEMBED_TRITON_PYTHON"] = str(python)


def pytest_unconfigure(config: pytest.Config) -> None:
    if getattr(config, "_kvembed_cache", None):  # the process that made it (not an xdist worker)
        shutil.rmtree(config._kvembed_cache, ignore_errors=True)
        shutil.rmtree(config._kvembed_shared, ignore_errors=True)


@pytest.fixture(scope="module")
def one_torch_thread():
    """For modules of tiny models (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``):
    they gain nothing from intra-op threads on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_config(arch: str):
    from transformers import (CohereConfig, Gemma2Config, GraniteConfig, LlamaConfig, MistralConfig, Olmo2Config, Phi3Config, Qwen2Config,
                              Qwen3Config, StableLmConfig)

    common = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=300,
        max_position_embeddings=256,
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen3":
        return Qwen3Config(**common)
    if arch == "qwen2":
        common.pop("head_dim")  # Qwen2 derives head_dim = hidden_size / heads = 16
        return Qwen2Config(**common)
    if arch == "mistral":
        return MistralConfig(sliding_window=MISTRAL_WINDOW, **common)
    if arch == "granite":  # every multiplier away from 1 (and from 1/sqrt(head_dim)), both bias switches on
        return GraniteConfig(embedding_multiplier=4.0, residual_multiplier=0.6, attention_multiplier=0.4,
                             logits_scaling=8.0, attention_bias=True, mlp_bias=True, **common)
    if arch == "olmo2":  # no head_dim field: hidden_size / heads, as for Qwen2
        common.pop("head_dim")
        return Olmo2Config(**common)
    if arch == "phi3":  # RoPE on half of each head (Phi-4-mini turns three quarters)
        common.pop("head_dim")
        return Phi3Config(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                          **common)
    if arch == "stablelm":  # StableLM 2's layout: sequential residual, no q/k norms, its default partial rotary
        common.pop("head_dim")
        return StableLmConfig(use_qkv_bias=True, **common)
    if arch == "cohere":  # Command-R's layout, its attention biases on
        return CohereConfig(attention_bias=True, **common)
    if arch == "gemma2":  # sliding and global layers past the window; a cap the random logits reach; its own scale
        return Gemma2Config(sliding_window=MISTRAL_WINDOW, attn_logit_softcapping=1.0, query_pre_attn_scalar=8,
                            hidden_activation="gelu_pytorch_tanh", **common)
    raise ValueError(arch)


def build_tiny_model(arch: str, folder: Path, seed: int = 0) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    demo = demo_model_path()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo / name, folder / name)
    return folder


def tiny_gguf(path: Path, architecture: str, layers: int = 2) -> Path:
    """A GGUF file written by the gguf package: ``general.architecture``, a block count and one
    small tensor; enough for a header reader, no model."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(layers)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """arch -> folder of a saved tiny random model with the demo tokenizer."""
    root = tmp_path_factory.mktemp("tiny")
    return {arch: build_tiny_model(arch, root / arch, seed=i) for i, arch in enumerate(ARCHITECTURES)}


@pytest.fixture(scope="session")
def model_paths(tiny_models) -> dict[str, Path]:
    """Every test model: the tiny ones of ARCHITECTURES and the real stories260k."""
    return {**tiny_models, "stories260k": demo_model_path()}


@pytest.fixture(scope="session")
def oracle(model_paths) -> Callable[[str], Oracle]:
    """name ("llama", ..., "stories260k") or folder -> the independent oracle of that model
    (tests/independent.py: reads the folder's weights, config and tokenizer itself)."""
    cache: dict[str, Oracle] = {}

    def get(name: str | Path) -> Oracle:
        folder = str(model_paths.get(name, name)) if isinstance(name, str) else str(name)
        if folder not in cache:
            cache[folder] = Oracle(folder)
        return cache[folder]

    return get


class TraceCache:
    """One loaded embedder and one traced Exporter per (model, method, options), shared by tests:
    every precision of a (model, method) is written from a single trace."""

    def __init__(self) -> None:
        self.entries: dict[tuple, Any] = {}

    def get(self, model: str | Path, method: str, **options: Any) -> Any:
        from kvembed.export.core import Exporter, load_embedder

        key = (str(model), method, tuple(sorted(options.items())))
        if key not in self.entries:
            self.entries[key] = Exporter(load_embedder(str(model), method, **options))
        return self.entries[key]

    def close(self) -> None:
        for exporter in self.entries.values():
            exporter.close()


@pytest.fixture(scope="session")
def traces():
    cache = TraceCache()
    yield cache
    cache.close()


@pytest.fixture(scope="session")
def stories_artifact(traces) -> Callable[..., Path]:
    """``stories_artifact(method, precision="fp32", int8_recipe="auto", certify_emulated=False, attention=None,
    **options)`` -> the directory of the demo model's artifact, exported once per session (several
    precisions from one trace; ``attention`` another form than the default, from a trace of its
    own); ``options`` are the method's.

    Shared by every test file and both pytest-xdist workers (the first to ask exports it, under a
    lock; the export's own staged write makes it appear whole): treat it as read-only (copy it
    before damaging it)."""
    import fcntl
    import hashlib

    from kvembed.export.core import Exporter

    root = Path(os.environ[SHARED_ARTIFACTS])  # made by pytest_configure for the whole run
    made: dict[tuple, Path] = {}

    def get(method: str, precision: str = "fp32", int8_recipe: str = "auto", certify_emulated: bool = False,
            attention: str | None = None, **options: Any) -> Path:
        key = (method, precision, int8_recipe, certify_emulated, tuple(sorted(options.items())))
        if attention is not None:  # another form than the default is a trace of its own
            key += (("attention", attention),)
        if key not in made:
            digest = hashlib.sha256(repr(key).encode()).hexdigest()[:6]
            out = root / f"{method}-{precision}-{digest}"  # short: the CLI prints it in a table title
            with open(root / f"{out.name}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not (out / MANIFEST).is_file():
                    threads = torch.get_num_threads()
                    torch.set_num_threads(1)  # a tiny model gains nothing from OpenMP threads on a shared host
                    try:
                        exporter = traces.get("stories260k", method, **options)
                        if attention is not None:
                            with Exporter(exporter.embedder, attention=attention) as other:
                                other.write(out, precision, int8_recipe=int8_recipe, certify_emulated=certify_emulated)
                        else:
                            exporter.write(out, precision, int8_recipe=int8_recipe, certify_emulated=certify_emulated)
                    finally:
                        torch.set_num_threads(threads)
            made[key] = out
        return made[key]

    return get


@pytest.fixture(scope="session")
def stories_decomposed(stories_artifact) -> Path:
    """The demo model's kv-embedding fp32 artifact exported with ``attention="decomposed"`` (opset
    18: MatMul/Softmax, K/V heads repeated in the graph), shared as :func:`stories_artifact`'s are. Read-only."""
    return stories_artifact("kv-embedding", attention="decomposed")


@pytest.fixture(scope="session")
def llama2_tokenizer_path() -> Path:
    if not (LLAMA2_TOKENIZER / "tokenizer.json").is_file():
        pytest.skip(f"the Llama 2 tokenizer is not at {LLAMA2_TOKENIZER} (it lives in ../shared, not in the repo)")
    return LLAMA2_TOKENIZER
