"""The gate runs each distinct padded row once per side: where a method's query and document
tokenise alike (no prompt tells them apart), the two rows are one input, run once and compared
as both rows."""

from __future__ import annotations

import pytest

from kvembed.artifact import load_manifest
from kvembed.export.gate.parity import GATE_TEXTS, compare_runs, gate_batches, parity_session
from kvembed.runtime.artifact import encoder_from_manifest

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("method,merged", [("mean", True), ("kv-embedding", False)])
def test_rows_that_tokenise_alike_run_once_and_are_compared_as_both(stories_artifact, method, merged):
    artifact = stories_artifact(method)
    encoder = encoder_from_manifest(artifact, load_manifest(artifact))
    session = parity_session(artifact / "model.onnx")
    feeds = {i.name for i in session.get_inputs()}
    ran: list[int] = []

    def run(batch):
        ran.append(int(batch["input_ids"].shape[0]))
        return session.run(["embedding", "pooled"], {k: v for k, v in batch.items() if k in feeds})

    def reference(batch, key):  # the same graph: this test counts what runs, parity is test_export's
        return session.run(["embedding", "pooled"], {k: v for k, v in batch.items() if k in feeds})

    report = compare_runs(run, reference, encoder, "fp32", dict(GATE_TEXTS))
    batches = gate_batches(GATE_TEXTS)
    # counted here from the token ids themselves: a row is new when no earlier row of its batch has its ids
    distinct_rows = [len({tuple(e.ids) for e in batch.encode(encoder, GATE_TEXTS)}) for batch in batches]
    all_rows = [len(batch.rows) for batch in batches]
    assert ran == distinct_rows
    assert report.rows == sum(all_rows) and report.batches == len(batches)  # every row compared
    assert (sum(distinct_rows) < sum(all_rows)) == merged
    assert set(report.by_case) >= {"query/right", "document/right", "query/left", "document/left"}
