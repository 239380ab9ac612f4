"""The parity gate stopping at its first miss (``stop_at_miss``): what a recipe with another to fall
back to runs, and what its report and the exporter's progress say.

A stopped comparison must reach the same verdict as the full one on fewer batches, say so in its
report, and leave every later output unrun; the last recipe tried keeps the full gate.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from checks import MIN_COSINE, cosines, oracle_rows
from kvembed.artifact import load_manifest
from kvembed.export.core import Exporter, ParityError, load_embedder
from kvembed.export.gate.parity import GATE_TEXTS, ParityReport, gate_batches, parity_reports, run_parity
from kvembed.export.gate.certify import gate_session
from kvembed.export.gate.targets import CPU
from kvembed.export.precision.convert import int8_plan
from kvembed.runtime import Embedder
from kvembed.runtime.artifact import encoder_from_manifest

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STORIES = "stories260k"
ALSO = ("last=kv-embedding:pooling=last",)  # the same artifact test_also.py and test_triton.py export
WRONG_LAYERS = "2"  # the graph re-routes layers 1-3: a reference re-routing layer 2 only differs from the first batch
PLANNED = len(gate_batches(GATE_TEXTS))


@pytest.fixture(scope="module")
def gate(stories_artifact):
    """The demo model's kv-embedding artifact with one extra output, its gate session and encoder,
    and references: the extra output's own, and a wrong one for the main output."""
    path = stories_artifact("kv-embedding", also=ALSO)
    encoder = encoder_from_manifest(path, load_manifest(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        references = load_embedder(STORIES, "kv-embedding", also=list(ALSO)).references()
        wrong = load_embedder(STORIES, "kv-embedding", layers=WRONG_LAYERS)
    return path, gate_session(CPU, path / "model.onnx"), encoder, references, wrong


def test_a_gate_stopped_at_its_first_miss_compares_fewer_batches_and_says_so(gate, oracle):
    path, session, encoder, _, wrong = gate
    full = run_parity(session, encoder, wrong, "fp32")
    stopped = run_parity(session, encoder, wrong, "fp32", stop_at_miss=True)
    assert not full.passed and not full.stopped_early and full.batches == PLANNED
    assert not stopped.passed and stopped.stopped_early and stopped.batches == 1 < PLANNED
    # the first batch's worst row, by numpy here: the artifact through the runtime against the oracle
    # of the wrong reference's method (layer 2 re-routed only)
    first_batch = gate_batches(GATE_TEXTS)[0]
    kinds = list(dict.fromkeys(kind for kind, _ in first_batch.rows))
    embedder, demo = Embedder.load(path, provider="cpu", threads=1), oracle(STORIES)
    first = 1.0
    for kind in kinds:  # the first batch holds queries and documents
        texts = [GATE_TEXTS[n] for k, n in first_batch.rows if k == kind]
        got = embedder.encode(texts, kind=kind)
        want = oracle_rows(demo, "kv-embedding", texts, kind, layers=WRONG_LAYERS)
        first = min(first, float(cosines(got, want).min()))
    assert first < MIN_COSINE["fp32"]
    assert stopped.worst_cosine == pytest.approx(first, abs=1e-5) and stopped.rows == len(first_batch.rows)
    assert full.worst_cosine <= stopped.worst_cosine and list(stopped.by_case) == [f"{kind}/right" for kind in kinds]
    assert "stopped at the first miss" in stopped.summary() and "stopped" not in full.summary()
    # the manifest form keeps the flag, and a record written before it existed reads as a full gate
    assert ParityReport.from_dict(stopped.to_dict()) == stopped
    old = {k: v for k, v in full.to_dict().items() if k != "stopped_early"}
    assert ParityReport.from_dict(old) == full


def test_a_token_mismatch_stops_the_gate_at_the_first_batch(gate):
    """A reference that prompts differently: every batch's ids differ; a stopped gate asks once."""
    _, session, encoder, _, _ = gate
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prompted = load_embedder(STORIES, "kv-embedding", prompt="Represent: {text}")
    full = run_parity(session, encoder, prompted, "fp32")
    stopped = run_parity(session, encoder, prompted, "fp32", stop_at_miss=True)
    assert full.rows == stopped.rows == 0 and not full.passed and not stopped.passed
    assert len(full.problems) == PLANNED and not full.stopped_early
    assert len(stopped.problems) == 1 and stopped.stopped_early
    assert stopped.problems[0].startswith("token ids differ from the reference's")


def test_once_the_main_output_missed_the_extra_outputs_are_not_run(gate):
    _, session, encoder, references, wrong = gate
    mixed = {**references, None: wrong}
    assert list(mixed) == [None, "last"]
    full = parity_reports(session, encoder, mixed, "fp32")
    assert list(full) == [None, "last"] and not full[None].passed and full["last"].passed
    stopped = parity_reports(session, encoder, mixed, "fp32", stop_at_miss=True)
    assert list(stopped) == [None] and stopped[None].stopped_early


def test_auto_stops_every_recipe_but_the_last_whose_report_stays_complete(tiny_models, tmp_path):
    """int8 ``auto`` on a tiny Qwen3 against a reference of another layer band: every recipe misses.
    Each one with a recipe after it is told so at its first miss; the last one, whose report the
    user gets, compares every batch; nothing is written."""
    lines: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        embedder = load_embedder(str(tiny_models["qwen3"]), "kv-embedding")
    assert embedder.method.layers != (int(WRONG_LAYERS),)
    with Exporter(embedder, progress=lambda stage, detail: lines.append(f"{stage}: {detail}")) as exporter:
        plan = int8_plan("auto", exporter.opset)
        with pytest.raises(ParityError) as info:
            exporter.write(tmp_path / "int8", "int8", reference_options={"layers": WRONG_LAYERS})
        planned = len(gate_batches(exporter.gate_texts))
    report = info.value.report
    assert not report.passed and not report.stopped_early and report.batches == planned
    assert "stopped" not in str(info.value)
    fallbacks = [line for line in lines if line.startswith("fallback: ")]
    assert len(plan) >= 2 and len(fallbacks) == len(plan) - 1
    for recipe, following, line in zip(plan, plan[1:], fallbacks):
        assert line.startswith(f"fallback: int8 recipe {recipe} missed the gate (")
        assert line.endswith(", stopped at the first miss); trying " + following), line
    assert not (tmp_path / "int8").exists()
