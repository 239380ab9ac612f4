"""Benchmark scenarios (benchmarks/scenarios/*.toml): each one runs in its smoke size through the
real command line, as CI runs them so that none rots, and a bad scenario file is one line."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvembed.cli.main import app
from kvembed.bench.served import kvembed_command

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SCENARIOS = sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "scenarios").glob("*.toml"))
#: the one scenario whose smoke exports its own model; the others run on the session's demo-model
#: artifact of their method (``--artifact``: the same smoke size, without another trace of it)
EXPORTS_ITS_OWN = "cpu-paths"
runner = CliRunner()


def test_the_suite_has_scenarios():
    assert len(SCENARIOS) >= 2, SCENARIOS


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_every_scenario_runs_in_its_smoke_size(scenario, stories_artifact, tmp_path):
    out = tmp_path / "out"
    given = []
    if scenario.stem != EXPORTS_ITS_OWN:
        method = tomllib.loads(scenario.read_text(encoding="utf-8")).get("method", "kv-embedding")
        given = ["--artifact", str(stories_artifact(method))]
    done = subprocess.run([*kvembed_command(), "bench", "--scenario", str(scenario), "--smoke", *given, "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["setup"]["scenario"] == f"{scenario.stem} [smoke]"
    cells = results["cells"]
    assert cells and {c["backend"] for c in cells} == set(results["setup"]["backends"])
    peaks = results["peaks"]
    assert peaks and all(p["gflops"] > 0 for p in peaks.values())
    for cell in cells:  # how close to this machine's GEMM peak for its arithmetic each cell ran, probed in this run
        assert cell["pct_of_peak"] == pytest.approx(100.0 * cell["gflops"] / peaks[cell["peak_of"]]["gflops"])
        assert cell["p50_ms"] > 0 and cell["peak_rss_mb"] > 0
    compared = [c for c in cells if c["cosine_vs_baseline"] is not None]
    assert all(c["cosine_vs_baseline"] > 0.9999 for c in compared), compared


@pytest.mark.parametrize("text, message", [
    ("model = 3\n", "model must be a string, got 3"),
    ("batch_sizes = [1, 2]\nrepeats = 4\n", "unknown key repeats"),
    ("batch_sizes = [0]\n", "--batch-sizes: 0 is not a positive integer"),
    ("[smoke]\nthreads = true\n", "[smoke]: threads must be an integer, got True"),
    ("smoke = 1\n", "smoke must be a table"),
    ("model = \n", "is not TOML"),
    ("gemm_size = 0\n", "gemm_size must be a positive integer"),
    (f"model = \"{'a' * 5000}\"\n", "(5000 characters) is not a model folder, alias or hub id"),
    ("artifact = \"no/such/artifact\"\n", "benchmarks the artifact 'no/such/artifact', which is not here: give --artifact DIR"),
    (f"artifact = \"{'../' * 2000}x\"\n", "(6003 characters), which is not here: give --artifact DIR"),
])
def test_a_bad_scenario_is_one_line_exit_2(text, message, tmp_path):
    scenario = tmp_path / "bad.toml"
    scenario.write_text(text)
    result = runner.invoke(app, ["bench", "--scenario", str(scenario), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "out").exists()


def test_smoke_needs_a_scenario_and_a_missing_file_is_named(tmp_path):
    result = runner.invoke(app, ["bench", "--smoke", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "--smoke runs a scenario's [smoke] size: add --scenario FILE" in result.output
    result = runner.invoke(app, ["bench", "--scenario", str(tmp_path / "none.toml"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "no scenario file at" in result.output
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    result = runner.invoke(app, ["bench", "--scenario", str(binary), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "is not TOML" in result.output and "Traceback" not in result.output


def test_an_artifact_given_beside_a_scenario_replaces_its_model_method_and_precisions(tmp_path):
    scenario = tmp_path / "s.toml"
    scenario.write_text('model = "smollm2-135m"\nmethod = "last-token"\nprecisions = ["fp32", "int8"]\nbatch_sizes = [0]\n')
    result = runner.invoke(app, ["bench", "--scenario", str(scenario), "--artifact", str(tmp_path / "none"), "--out", str(tmp_path / "out")])
    # past the scenario's model and method (no "an artifact fixes its model" refusal): its own values are checked
    assert result.exit_code == 2 and "--batch-sizes: 0 is not a positive integer" in result.output, result.output
