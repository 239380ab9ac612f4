"""Issue 47, item 4: a command line that says what it is doing.

- every wait announces itself before it starts (whole lines on stderr when piped; stdout keeps
  the data), and one line names the backend and precision that ran: the real programs are run
  as subprocesses with ``KVEMBED_STATUS_AFTER=0`` (every step announced as it starts, instead of
  after a second), their output piped;
- the display itself (:class:`kvembed.cli.status.Waits`) with a slow stand-in step: a step that
  outlasts the threshold is announced while it runs, a quick one stays silent, lines are whole;
- tables at ``COLUMNS=80`` print every number whole: the numbers are read independently from
  what the commands wrote (results.json, .npy, the manifest's recorded certificates);
- ``--version``, help without reST markup, and one spelling of every install hint.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from kvembed.status import waiting
from kvembed.cli.status import AFTER_ENV, Waits
from kvembed.version import __version__

pytestmark = pytest.mark.usefixtures("one_torch_thread")

KVEMBED = str(Path(sys.executable).with_name("kvembed"))
NARROW = {"COLUMNS": "80", AFTER_ENV: "0"}
#: a number as the tables print them (cosines, scores, latencies)
NUMBER = re.compile(r"[-+]?\d+\.\d+")


def kvembed(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """The installed program, output piped (not a terminal), 80 columns, every step announced."""
    done = subprocess.run([KVEMBED, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **NARROW, **(env or {})})
    assert "Traceback" not in done.stderr, done.stderr
    return done


def in_order(text: str, *parts: str) -> None:
    """Each of ``parts`` occurs in ``text``, each after the one before."""
    at = 0
    for part in parts:
        found = text.find(part, at)
        assert found >= 0, f"{part!r} not found after position {at} in:\n{text}"
        at = found + len(part)


def table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line[:1] in "┏┃┡│└"]


def assert_fits(text: str, width: int = 80) -> None:
    """Every table line within ``width`` columns, no cell cut short."""
    lines = table_lines(text)
    assert lines, text
    assert all(len(line) <= width for line in lines), "\n".join(line for line in lines if len(line) > width)
    assert "…" not in text, text


def numbers(text: str) -> set[str]:
    return set(NUMBER.findall(text))


@pytest.fixture(scope="module")
def kv_artifact(stories_artifact) -> Path:
    return stories_artifact("kv-embedding")


# -- the display itself ----------------------------------------------------------------------------


def test_a_slow_step_is_announced_while_it_runs_and_a_quick_one_not_at_all(monkeypatch):
    """A stand-in step slower than the threshold gets its line while it runs (before its end), and a
    line of its time after; a quick step prints nothing, so a command that fails at once still
    prints its one error line alone. The slow step runs until its line shows (a loaded machine may
    fire the timer late), so nothing here depends on how fast the machine is."""
    monkeypatch.setenv(AFTER_ENV, "0.5")
    lines: list[str] = []
    with Waits(spinner=False, show=lines.append):
        with waiting("a quick step"):
            pass
        with waiting("a slow stand-in step"):
            deadline = time.monotonic() + 60
            while not lines and time.monotonic() < deadline:
                time.sleep(0.05)
            seen_while_running = list(lines)
    assert seen_while_running == ["a slow stand-in step ..."]
    assert len(lines) == 2 and re.fullmatch(r"  done a slow stand-in step \(\d+\.\ds\)", lines[1]), lines


def test_piped_lines_are_whole_however_long(monkeypatch):
    """An 80-column console that is not a terminal: a long step phrase stays one line, not wrapped."""
    monkeypatch.setenv(AFTER_ENV, "0")
    out = io.StringIO()
    phrase = "compiling model.onnx for OpenVINO (bf16 hint; first load: kept in " + "/very/long/cache/path" * 5 + " for the next)"
    with Waits(console=Console(file=out, width=80)):
        with waiting(phrase):
            pass
    assert out.getvalue().splitlines()[0] == f"{phrase} ...", out.getvalue()


def test_nested_displays_hand_over_and_back():
    """The innermost display shows the steps (bench's progress, serve's log), then the outer one again."""
    outer: list[str] = []
    inner: list[str] = []
    with Waits(spinner=False, show=outer.append) as first:
        first.after = first.threshold = 0
        with Waits(spinner=False, show=inner.append) as second:
            second.after = second.threshold = 0
            with waiting("inside"):
                pass
        first.after = 0
        with waiting("outside"):
            pass
    assert [line.split(" (")[0] for line in inner] == ["inside ...", "  done inside"]
    assert outer[0] == "outside ..."


# -- every wait announced, the runtime named --------------------------------------------------------


def test_embed_announces_each_wait_and_names_the_runtime_on_stderr_only(kv_artifact):
    done = kvembed("embed", str(kv_artifact), "A cat sat on the mat.", "A kitten sat on a rug.")
    assert done.returncode == 0, done.stderr
    in_order(done.stderr, f"checking the sha256 of the files of {kv_artifact} ...",
             f"opening the graph of {kv_artifact} on onnxruntime-cpu ...",
             "runtime: onnxruntime-cpu running the fp32 artifact (provider auto)\n", "embedding 2 text(s) ...")
    assert "runtime:" not in done.stdout and " ..." not in done.stdout  # stdout: the table only
    assert "kv-embedding on" in done.stdout


def test_embed_with_a_model_announces_the_pytorch_load():
    done = kvembed("embed", "--model", "stories260k", "A cat sat on the mat.")
    assert done.returncode == 0, done.stderr
    in_order(done.stderr, "loading stories260k with PyTorch ...", "loading the weights of stories260k ...",
             "runtime: pytorch running the fp32 reference of stories260k", "embedding 1 text(s) ...")


def test_a_bf16_artifact_names_the_backend_and_why(stories_artifact):
    """The user's bf16 case: which backend ran it (OpenVINO only once certified, else onnxruntime) and why."""
    from kvembed.backends.catalogue import choose_backend
    from kvembed.backends.cpu import cpu_features

    # a CPU without BF16 gates bf16 only as it runs here (f32), said so in the certificate
    artifact = stories_artifact("kv-embedding", "bf16", certify_emulated=not cpu_features().bf16)
    done = kvembed("embed", str(artifact), "A cat sat on the mat.")
    assert done.returncode == 0, done.stderr
    choice = choose_backend(artifact)
    line = next(line for line in done.stderr.splitlines() if line.startswith("runtime: "))
    assert line.startswith(f"runtime: {choice.backend}") and "running the bf16 artifact (provider auto: " in line
    if choice.backend == "openvino":
        assert "compiling model.onnx for OpenVINO" in done.stderr or "from the OpenVINO cache" in done.stderr


def test_export_announces_every_stage_before_it_runs(tmp_path):
    out = tmp_path / "artifact"
    done = kvembed("export", "--model", "stories260k", "--method", "mean", "--out", str(out))
    assert done.returncode == 0, done.stderr
    stages = ["load: loading stories260k (mean)", "trace: tracing mean", "optimize:", "convert:", "check:", "parity:", "write:"]
    in_order(done.stderr, *(f"{stage}" for stage in stages))  # each announced as it starts, on stderr
    for stage in stages:
        in_order(done.stderr, stage, " ...\n")
    in_order(done.stdout, *(f"  done {stage}" for stage in stages))  # its time in the report
    assert "parity vs PyTorch" in done.stdout and " ..." not in done.stdout


def test_serve_start_up_announces_its_waits_and_the_runtime(kv_artifact, tmp_path):
    from kvembed.bench.served import ServerProcess

    server = ServerProcess([f"kv={kv_artifact}", "--threads", "1"], tmp_path / "serve.log", env=NARROW, port=0)
    try:
        server.wait_healthy()
        log = server.output()
    finally:
        server.stop()
    in_order(log, "loading the server (FastAPI, uvicorn) ...", "checking the sha256 of the files of 1 artifact(s) ...",
             f"opening the graph of {kv_artifact} on onnxruntime-cpu ...",
             "kvembed serve: kv: runtime: onnxruntime-cpu running the fp32 artifact (provider auto)",
             "kvembed serve: serving 1 model(s)")


# -- tables at 80 columns ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def eval_run(stories_artifact, tmp_path_factory):
    kv, kv_int8 = stories_artifact("kv-embedding"), stories_artifact("kv-embedding", "int8")
    out = tmp_path_factory.mktemp("eval-80") / "out"
    done = kvembed("eval", f"kv={kv}", f"kv-int8={kv_int8}", "--task", "sample", "--out", str(out))
    assert done.returncode == 0, done.stderr
    return done, json.loads((out / "results.json").read_text(encoding="utf-8"))


def test_eval_announces_loading_and_scoring_and_names_each_runtime(eval_run):
    done, report = eval_run
    backends = {c["label"]: c["backend"] for c in report["configurations"]}
    in_order(done.stderr, "loading mteb and the tasks ...", "loading kv (", f"kv: runtime: {backends['kv']} running the fp32 artifact",
             "scoring kv on 3 task(s) ...", "loading kv-int8 (", f"kv-int8: runtime: {backends['kv-int8']} running the int8 artifact",
             "scoring kv-int8 on 3 task(s) ...")


def test_eval_table_prints_every_number_whole_at_80_columns(eval_run):
    done, report = eval_run
    assert_fits(done.stdout)
    shown = numbers(done.stdout)
    for config in report["configurations"]:
        label = config["label"]
        assert f"{config['gate_worst_cosine']:.5f}" in shown and f"{config['held_out_worst_cosine']:.5f}" in shown
        for task, scores in report["scores"][label].items():
            assert f"{scores['main_score']:.4f}" in shown, (label, task)
        assert any(line.startswith(f"│ {label} ") for line in table_lines(done.stdout))  # labels whole too
    for header in ("configuration", "precision (backend)"):
        assert header.split()[0] in done.stdout


def test_verify_prints_every_number_whole_at_80_columns(kv_artifact, tmp_path):
    """--record writes what verify measured into the manifest: the worst cosines printed must be those."""
    copy = tmp_path / "kv"
    shutil.copytree(kv_artifact, copy)
    done = kvembed("verify", str(copy), "--record")
    assert done.returncode == 0, done.stdout + done.stderr
    assert_fits(done.stdout)
    manifest = json.loads((copy / "kvembed.json").read_text(encoding="utf-8"))
    certified = manifest["certified"]
    assert certified
    shown = numbers(done.stdout)
    for certificate in certified:
        assert f"{certificate['worst_cosine']:.7f}" in shown, certificate


def test_embed_similarity_prints_every_cosine_whole_at_80_columns(kv_artifact, tmp_path):
    texts = [f"text number {i} about cats and mats" for i in range(12)]
    vectors_file = tmp_path / "vectors.npy"
    done = kvembed("embed", str(kv_artifact), "--similarity", "--output", str(vectors_file), *texts)
    assert done.returncode == 0, done.stderr
    assert_fits(done.stdout)
    vectors = np.load(vectors_file)
    shown = numbers(done.stdout)
    similarity = vectors @ vectors.T
    assert all(f"{value:.4f}" in shown for value in similarity.ravel())
    assert "cosine similarity (continued)" in done.stdout  # twelve columns do not fit side by side: stacked


def test_bench_prints_every_number_whole_at_80_columns(kv_artifact, tmp_path):
    """Piped (80 columns) and on an 80-column terminal alike: stacked tables, every number whole
    (results.md keeps the one wide table)."""
    from kvembed.bench.report import COLUMNS
    from kvembed.cli import bench as cli_bench

    out = tmp_path / "bench"
    done = kvembed("bench", "--artifact", str(kv_artifact), "--backends", "runtime", "--batch-sizes", "1",
                   "--seq-lens", "16", "--threads", "1", "--warmup", "0", "--min-repeats", "1", "--min-seconds", "0",
                   "--max-repeats", "1", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    cells = json.loads((out / "results.json").read_text(encoding="utf-8"))["cells"]
    assert len(cells) == 1
    assert_fits(done.stdout)
    assert {f"{cells[0][key]:.3f}" for key in ("p50_ms", "p95_ms", "p99_ms")} <= numbers(done.stdout)
    assert "kvembed bench (continued)" in done.stdout
    assert f"| {cells[0]['p50_ms']:.3f} |" in (out / "results.md").read_text(encoding="utf-8")

    terminal = io.StringIO()
    original = cli_bench.console
    cli_bench.console = Console(file=terminal, width=80, force_terminal=True, color_system=None)
    try:
        cli_bench.print_cells(cells)
    finally:
        cli_bench.console = original
    assert_fits(terminal.getvalue())
    shown = numbers(terminal.getvalue())
    for key in ("p50_ms", "p95_ms", "p99_ms"):
        assert f"{cells[0][key]:.3f}" in shown
    assert sum(header.split()[0] in terminal.getvalue() for header in COLUMNS) == len(COLUMNS)


# -- version, help, install hints -------------------------------------------------------------------


@pytest.mark.parametrize("program", ["kvembed", "kvembed-export", "kvembed-layers"])
def test_version(program):
    done = subprocess.run([str(Path(sys.executable).with_name(program)), "--version"], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"kvembed {__version__}\n", "")


def test_version_is_listed_in_the_help():
    from kvembed.cli.main import app

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output == f"kvembed {__version__}\n"
    assert "--version" in CliRunner().invoke(app, ["--help"], terminal_width=80).output


def test_no_help_shows_raw_markup():
    """Every program's and subcommand's --help at 80 columns: no ``literal``, :role:`x` or **bold**."""
    from cli_smoke import command_paths

    from kvembed.cli.export import app as export_app
    from kvembed.cli.layers import app as layers_app
    from kvembed.cli.main import app

    programs = {"kvembed": app, "kvembed-export": export_app, "kvembed-layers": layers_app}
    markup = re.compile(r"``|:[a-z]+:`|\*\*")
    for path in command_paths():
        result = CliRunner().invoke(programs[path[0]], [*path[1:], "--help"], terminal_width=80, env={"COLUMNS": "80"})
        assert result.exit_code == 0, (path, result.output)
        assert not markup.search(result.output), f"{' '.join(path)} --help:\n{result.output}"


def test_plain_help_drops_rest_markup():
    from kvembed.cli.support import plain_help

    assert plain_help("``kvembed`` runs :func:`~kvembed.runtime.Embedder.load` and ``x``") == "kvembed runs kvembed.runtime.Embedder.load and x"


def test_the_install_hint_for_a_missing_openvino_names_its_extra():
    from kvembed.backends.openvino import INSTALL
    from kvembed.extras import install_hint, missing_extra_message

    err = ModuleNotFoundError("No module named 'openvino'", name="openvino")
    assert "pip install 'kvembed[openvino]'" in missing_extra_message(err, "kvembed verify")
    assert INSTALL == install_hint("openvino") == "pip install 'kvembed[openvino]'"
    with pytest.raises(ValueError):
        install_hint("openvno")


def test_a_stage_detail_with_an_install_hint_is_shown_as_written(monkeypatch):
    """The int8 export's advisory stage said "(pip install 'kvembed')": rich took [openvino] for markup."""
    from kvembed.cli.export import StageDisplay

    monkeypatch.setenv(AFTER_ENV, "0")
    out = io.StringIO()
    detail = "no openvino-bf16 certificate: openvino is not installed (pip install 'kvembed[openvino]')"
    with Waits(console=Console(file=out, width=80)), StageDisplay() as display:
        display("parity", detail)
    assert out.getvalue().splitlines()[0] == f"parity: {detail} ...", out.getvalue()


def test_every_install_hint_comes_from_install_hint():
    package = Path(__file__).resolve().parents[1] / "src" / "kvembed"
    typed = re.compile(r"pip install '?kvembed\[")
    found = sorted(str(path.relative_to(package)) for path in package.rglob("*.py")
                   if path.name != "extras.py" and any(typed.search(line) and not line.lstrip().startswith(("#", "``", "(``"))
                                                       and "``pip install" not in line
                                                       for line in path.read_text(encoding="utf-8").splitlines()))
    assert not found, found
