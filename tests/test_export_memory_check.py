"""The export refuses early, not by the OOM killer (issue 30, item 5): an estimate of the export's
peak from config.json alone, what this process may use (MemAvailable, cgroups,
KVEMBED_MEMORY_LIMIT), and a one-line refusal before any weights load.

Real files throughout: config.json folders, fake /proc and cgroup trees fed to the parser, a
fake hub cache. Parameter counts are checked against transformers' own models
built on the ``meta`` device (no weights allocated), the independent oracle.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import tiny_config
from kvembed.errors import KvembedError
from kvembed.export.memory import (
    GIB, LIMIT_ENV, COEFFICIENTS, MemoryBudget, MemoryEstimateWarning, NotEnoughMemory, available_memory,
    check_export_memory, count_parameters, estimate_export_peak, export_memory_check,
)
from kvembed.methods import demo_model_path

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: Qwen3-4B's shape (config.json of Qwen/Qwen3-4B, the keys the estimate reads)
QWEN3_4B = {
    "model_type": "qwen3", "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "hidden_act": "silu",
}


def meta_parameters(config_dict: dict, layers: int | None = None) -> int:
    """Parameters of transformers' bare decoder (``AutoModel``: no lm_head) for ``config_dict``,
    built on the meta device."""
    from transformers import AutoConfig, AutoModel

    data = dict(config_dict, **({} if layers is None else {"num_hidden_layers": layers}))
    config = AutoConfig.for_model(data.pop("model_type"), **data)
    with torch.device("meta"):
        model = AutoModel.from_config(config)
    return sum(p.numel() for p in model.parameters())


def write_config(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def run_export(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvembed.cli.export", *args], capture_output=True, text=True,
        env={**os.environ, **(env or {})}, timeout=600,
    )


@pytest.fixture
def broken_demo(tmp_path) -> Path:
    """The demo model with unreadable weights: anything it says came before the weights loaded."""
    folder = shutil.copytree(demo_model_path(), tmp_path / "broken")
    for weights in folder.glob("*.safetensors"):
        weights.write_bytes(b"not safetensors")
    return folder


# -- the parameter count ------------------------------------------------------------------------


def test_qwen3_4b_parameter_count_matches_transformers_on_meta(tmp_path):
    folder = write_config(tmp_path / "Qwen3-4B-shaped", QWEN3_4B)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    estimate = estimate_export_peak(config, "fp32", layers_needed=None, source_dtype="bfloat16", gguf=False)
    assert estimate.params_loaded == meta_parameters(QWEN3_4B)
    assert estimate.params_kept == estimate.params_loaded and estimate.layers_needed == 36
    # an early exit keeps fewer layers in the artifact: as many as a 10-layer model has
    assert estimate_export_peak(config, "fp32", layers_needed=10).params_kept == meta_parameters(QWEN3_4B, layers=10)


# -- the stages ---------------------------------------------------------------------------------


def test_stages_follow_the_pipeline():
    fp32, fp16, int8 = (estimate_export_peak(QWEN3_4B, p, layers_needed=36, source_dtype="bfloat16") for p in ("fp32", "fp16", "int8"))
    # the reference is fp32 at every precision; fp16 sessions cost fp32; int8's is smaller
    assert fp32.stages["torch"] == fp16.stages["torch"] == int8.stages["torch"]
    assert fp32.stages["gate"] == fp16.stages["gate"] > int8.stages["gate"]
    assert "gguf" not in fp32.stages and fp32.stage == "torch"
    assert fp32.by_precision == {"fp32": fp32.peak, "fp16": fp16.peak, "int8": int8.peak}
    # the gate's session holds at least the fp32 weights (4 bytes each) for fp32
    assert fp32.stages["gate"] > 4 * fp32.params_kept
    # an early exit shrinks the session, not the reference (it loads the whole decoder)
    short = estimate_export_peak(QWEN3_4B, "fp32", layers_needed=4, source_dtype="bfloat16")
    assert short.stages["torch"] == fp32.stages["torch"] and short.stages["gate"] < fp32.stages["gate"]
    gguf = estimate_export_peak(QWEN3_4B, "fp32", layers_needed=36, gguf=True)
    assert gguf.stage == "gguf" and gguf.stages["gguf"] > 2 * 4 * gguf.params_loaded


def test_unknown_precision_and_incomplete_config_are_value_errors():
    with pytest.raises(ValueError, match="precision 'bf16'"):
        estimate_export_peak(QWEN3_4B, "bf16", layers_needed=None)
    with pytest.raises(ValueError, match="'hidden_size'"):
        estimate_export_peak({k: v for k, v in QWEN3_4B.items() if k != "hidden_size"}, "fp32", layers_needed=None)


# -- the check ----------------------------------------------------------------------------------


def test_refusal_says_needs_has_and_what_to_try():
    estimate = estimate_export_peak(QWEN3_4B, "fp32", layers_needed=36, source_dtype="bfloat16")
    check_export_memory(estimate, MemoryBudget(estimate.peak, "MemAvailable"), precision="fp32")  # fits exactly
    check_export_memory(estimate, MemoryBudget(None, "unknown"), precision="fp32")  # unknown: never refuses
    with pytest.raises(NotEnoughMemory) as caught:
        check_export_memory(estimate, MemoryBudget(8 * GIB, "cgroup v2 memory.max limit 8.0 GiB"), precision="fp32")
    message = str(caught.value)
    assert isinstance(caught.value, KvembedError) and "\n" not in message
    assert f"needs about {estimate.peak / GIB:.1f} GiB" in message and "PyTorch reference" in message
    assert "has 8.0 GiB (cgroup v2 memory.max" in message
    assert f"at least {-(-estimate.peak // GIB)} GiB" in message and "--skip-memory-check" in message
    assert "--precision" not in message  # the fp32 reference dominates every precision: none would fit


def test_refusal_suggests_a_cheaper_precision_and_fewer_layers_when_they_fit():
    """With coefficients where the session dominates (a cheaper reference) and fp16 sessions hold
    two bytes a weight, fp16 and an early exit are suggested with their own estimates; int8 is
    not, since its calibration runs the fp32 graph."""
    from dataclasses import replace

    coefficients = replace(COEFFICIENTS, reference_bytes_per_param=0.5,
                           session_bytes_per_param={"fp32": (4.0, 4.0), "fp16": (2.0, 2.0), "int8": (1.0, 4.0)})
    estimate = estimate_export_peak(QWEN3_4B, "fp32", layers_needed=36, coefficients=coefficients)
    assert estimate.by_precision["int8"] == estimate.peak  # calibration: the fp32 graph in a session
    budget = MemoryBudget(estimate.by_precision["fp16"] + GIB, LIMIT_ENV)
    assert estimate.by_precision["fp16"] < budget.available < estimate.peak
    with pytest.raises(NotEnoughMemory, match=r"--precision fp16 \(about [\d.]+ GiB\)") as caught:
        check_export_memory(estimate, budget, precision="fp32")
    assert "--precision int8" not in str(caught.value) and "fewer layers" in str(caught.value)


# -- what there is: /proc and cgroups, as files -------------------------------------------------


def fake_proc(root: Path, available_kb: int | None, cgroup: str) -> Path:
    (root / "self").mkdir(parents=True)
    lines = ["MemTotal:       33554432 kB", "MemFree:         1000000 kB"]
    if available_kb is not None:
        lines.append(f"MemAvailable:   {available_kb} kB")
    (root / "meminfo").write_text("\n".join(lines) + "\n", encoding="ascii")
    (root / "self" / "cgroup").write_text(cgroup, encoding="ascii")
    return root


def write_files(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="ascii")


def test_meminfo_without_cgroup_limits(tmp_path):
    proc = fake_proc(tmp_path / "proc", 8 * 1024 * 1024, "0::/\n")
    write_files(tmp_path / "cg", {"memory.max": "max\n", "memory.current": "123456\n"})
    assert available_memory(proc, tmp_path / "cg", environ={}) == MemoryBudget(8 * GIB, "MemAvailable")


def test_cgroup_v2_limit_of_the_process_group_binds(tmp_path):
    proc = fake_proc(tmp_path / "proc", 8 * 1024 * 1024, "0::/jobs/export\n")
    root = tmp_path / "cg"
    write_files(root, {"memory.max": "max\n", "memory.current": "9999999999\n"})
    write_files(root / "jobs" / "export", {
        "memory.max": f"{4 * GIB}\n", "memory.current": f"{3 * GIB}\n",
        "memory.stat": f"anon 1000\nfile 2000\ninactive_file {GIB // 2}\nactive_file 5\n",
    })
    budget = available_memory(proc, root, environ={})
    # 4 GiB limit - (3 GiB used - 0.5 GiB reclaimable cache)
    assert budget.available == 4 * GIB - (3 * GIB - GIB // 2)
    assert budget.bound_by.startswith("cgroup v2 memory.max limit 4.0 GiB")


def test_cgroup_v1_limit_of_an_ancestor_binds(tmp_path):
    """cgroup v1: the memory controller's own tree; the group's folder is absent from this view,
    its parent's limit applies; the v1 "no limit" value is not a limit."""
    proc = fake_proc(tmp_path / "proc", 16 * 1024 * 1024, "4:memory:/box/job1\n3:cpu:/\n0::/\n")
    root = tmp_path / "cg"
    write_files(root / "memory", {"memory.limit_in_bytes": "9223372036854771712\n", "memory.usage_in_bytes": "1\n"})
    write_files(root / "memory" / "box", {
        "memory.limit_in_bytes": f"{6 * GIB}\n", "memory.usage_in_bytes": f"{GIB}\n",
        "memory.stat": "cache 0\ntotal_inactive_file 0\n",
    })
    budget = available_memory(proc, root, environ={})
    assert budget.available == 5 * GIB and budget.bound_by.startswith("cgroup v1 memory.limit_in_bytes limit 6.0 GiB")


def test_no_proc_is_unknown_and_the_environment_caps(tmp_path):
    nowhere = tmp_path / "none"
    assert available_memory(nowhere, nowhere, environ={}) == MemoryBudget(None, "MemAvailable")
    assert available_memory(nowhere, nowhere, environ={LIMIT_ENV: "2GiB"}) == MemoryBudget(2 * GIB, LIMIT_ENV)
    proc = fake_proc(tmp_path / "proc", 1024 * 1024, "0::/\n")  # 1 GiB: below the cap, so it binds
    assert available_memory(proc, nowhere, environ={LIMIT_ENV: "2GiB"}).bound_by == "MemAvailable"
    assert available_memory(proc, nowhere, environ={LIMIT_ENV: "1048576"}) == MemoryBudget(1 << 20, LIMIT_ENV)
    with pytest.raises(ValueError, match=LIMIT_ENV):
        available_memory(proc, nowhere, environ={LIMIT_ENV: "lots"})


def test_this_machine_has_a_budget():
    budget = available_memory(environ={})
    assert budget.available is None or budget.available > 0


# -- finding config.json without weights --------------------------------------------------------


def test_layers_needed_comes_from_the_method_options():
    va = export_memory_check("stories260k", "va", "fp32", layers="0-1")
    assert va is not None and va.layers_needed == 2 and va.num_layers == 5
    assert va.params_kept == meta_parameters(json.loads((demo_model_path() / "config.json").read_text()), layers=2)
    kv = export_memory_check(str(demo_model_path()), "kv-embedding", "int8")
    assert kv is not None and kv.layers_needed == 5 and kv.precision == "int8"
    with_also = export_memory_check("stories260k", "va", "fp32", layers="0-1", also=["va:layers=3"])
    assert with_also is not None and with_also.layers_needed == 4


def test_incomplete_config_warns_and_does_not_refuse(tmp_path, monkeypatch):
    folder = write_config(tmp_path / "m", {"model_type": "llama", "num_hidden_layers": 4})
    monkeypatch.setenv(LIMIT_ENV, "1")
    with pytest.warns(MemoryEstimateWarning, match="no valid 'hidden_size'"):
        assert export_memory_check(str(folder), "kv-embedding", "fp32") is None


def test_a_hub_id_is_estimated_from_the_cache_only(tmp_path):
    """A hub-cache snapshot (built here as huggingface_hub lays it out) is read; an id that is
    not cached gives no estimate and no network call (the endpoint is a closed port)."""
    hub = tmp_path / "hub"
    snapshot = hub / "models--kvembed-test--tiny-qwen3" / "snapshots" / ("0" * 40)
    write_config(snapshot, tiny_config("qwen3").to_dict())
    (hub / "models--kvembed-test--tiny-qwen3" / "refs").mkdir()
    (hub / "models--kvembed-test--tiny-qwen3" / "refs" / "main").write_text("0" * 40, encoding="ascii")
    code = (
        "from kvembed.export.memory import export_memory_check as c\n"
        "e = c('kvembed-test/tiny-qwen3', 'kv-embedding', 'fp32'); print(e.params_loaded)\n"
        "print(c('kvembed-test/not-cached', 'kv-embedding', 'fp32'))\n"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": ""}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(meta_parameters(tiny_config("qwen3").to_dict())), "None"]


# -- the command line ---------------------------------------------------------------------------


def test_cli_refuses_before_loading_weights(broken_demo, tmp_path):
    out = tmp_path / "art"
    done = run_export("--model", str(broken_demo), "--method", "kv-embedding", "--out", str(out),
                      env={LIMIT_ENV: "100MiB"})
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    line = lines[0]
    assert line.startswith("error: not enough memory to export at fp32: it needs about")
    assert f"has 0.1 GiB ({LIMIT_ENV})" in line and "a machine with at least 1 GiB" in line
    assert "--skip-memory-check" in line
    # the weights are unreadable, so a refusal (not a weights error) came before they loaded
    assert "safetensors" not in done.stderr and not out.exists()
    assert not list(tmp_path.glob(".art.partial-*"))


def test_cli_help_shows_the_flag():
    done = run_export("--help", env={"COLUMNS": "200"})
    assert done.returncode == 0 and "--skip-memory-check" in done.stdout
    assert "export even if the estimated peak memory exceeds what is available" in " ".join(done.stdout.split())


def test_skip_memory_check_goes_past_the_check(broken_demo, tmp_path):
    """Skipped, the export goes on to read the weights (here unreadable: their one-line error, naming
    the file, not the refusal); past the check the export is every other export's."""
    done = run_export("--model", str(broken_demo), "--method", "kv-embedding", "--out", str(tmp_path / "a"),
                      "--skip-memory-check", env={LIMIT_ENV: "100MiB"})
    assert done.returncode == 2 and "not enough memory" not in done.stderr, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(said) == 1 and "model.safetensors' is not a readable safetensors file" in said[0], done.stderr
    assert "Traceback" not in done.stderr and "kvembed bug" not in done.stderr


def test_python_api_refuses_and_can_opt_out(broken_demo, tmp_path, monkeypatch):
    from kvembed.export.core import export_result

    monkeypatch.setenv(LIMIT_ENV, "100MiB")
    with pytest.raises(NotEnoughMemory, match="check_memory=False"):
        export_result(str(broken_demo), "kv-embedding", tmp_path / "a")
    with pytest.raises(Exception) as caught:  # past the check: the unreadable weights fail
        export_result(str(broken_demo), "kv-embedding", tmp_path / "a", check_memory=False)
    assert not isinstance(caught.value, NotEnoughMemory)
