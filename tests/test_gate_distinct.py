"""The gate runs each distinct padded row once per side: where a method's query and document
tokenise alike (no prompt tells them apart), the two rows are one input, run once and compared
as both rows."""

from __future__ import annotations

import pytest

from kvembed.artifact import load_manifest
from kvembed.export.gate.parity import GATE_TEXTS, compare_runs, gate_batches
from kvembed.backends.onnxruntime import ALLOW_SPINNING, DISABLE_PREPACKING, OnnxRuntimeSession
from kvembed.export.gate.certify import gate_session
from kvembed.export.gate.targets import CPU, CUDA
from kvembed import OnnxRuntimeOptions
from kvembed.runtime import Embedder
from kvembed.runtime.artifact import encoder_from_manifest

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("method,merged", [("mean", True), ("kv-embedding", False)])
def test_rows_that_tokenise_alike_run_once_and_are_compared_as_both(stories_artifact, method, merged):
    artifact = stories_artifact(method)
    encoder = encoder_from_manifest(artifact, load_manifest(artifact))
    session = gate_session(CPU, artifact / "model.onnx")
    feeds = set(session.input_names)
    ran: list[int] = []

    def run(batch):
        ran.append(int(batch["input_ids"].shape[0]))
        return session.run({k: v for k, v in batch.items() if k in feeds}, ["embedding", "pooled"])

    def reference(batch, key):  # the same graph: this test counts what runs, parity is test_export's
        return session.run({k: v for k, v in batch.items() if k in feeds}, ["embedding", "pooled"])

    report = compare_runs(run, reference, encoder, "fp32", dict(GATE_TEXTS))
    batches = gate_batches(GATE_TEXTS)
    # counted here from the token ids themselves: a row is new when no earlier row of its batch has its ids
    distinct_rows = [len({tuple(e.ids) for e in batch.encode(encoder, GATE_TEXTS)}) for batch in batches]
    all_rows = [len(batch.rows) for batch in batches]
    assert ran == distinct_rows
    assert report.rows == sum(all_rows) and report.batches == len(batches)  # every row compared
    assert (sum(distinct_rows) < sum(all_rows)) == merged
    assert set(report.by_case) >= {"query/right", "document/right", "query/left", "document/left"}


def test_the_gate_opens_its_session_through_the_backend_entry_with_lean_options(stories_artifact):
    """The gate's onnxruntime session is the runtime's backend with the gate's options (no packed
    weights, no arena or memory pattern, no spinning); the runtime takes the same settings as its options."""
    artifact = stories_artifact("mean")
    gate = gate_session(CPU, artifact / "model.onnx")
    assert isinstance(gate, OnnxRuntimeSession) and gate.name == "onnxruntime-cpu"
    options = gate.get_session_options()
    assert options.get_session_config_entry(DISABLE_PREPACKING) == "1"
    assert options.get_session_config_entry(ALLOW_SPINNING) == "0"
    assert not options.enable_cpu_mem_arena and not options.enable_mem_pattern
    runtime = Embedder.load(artifact, "cpu", options=OnnxRuntimeOptions(memory_arena=False, prepacking=False, spinning=False)).session
    same = runtime.get_session_options()
    assert same.get_session_config_entry(ALLOW_SPINNING) == "0" and not same.enable_mem_pattern
    default = Embedder.load(artifact, "cpu").session.get_session_options()
    assert default.enable_mem_pattern and default.get_session_config_entry(DISABLE_PREPACKING) == "0"
    with pytest.raises(ValueError, match="does not run on"):
        gate_session(CUDA, artifact / "model.onnx")
