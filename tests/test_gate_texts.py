"""The parity gate's texts and the held-out figure: the variety texts look like real input and share
nothing with the int8 calibration; the held-out slice is outside the gate's decision; a real export
records the held-out worst cosine in its manifest (checked against the independent oracle), prints
it, and a manifest from before still loads."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest

from kvembed.artifact import Manifest, load_manifest
from kvembed.errors import InvalidInput
from kvembed.export.gate.texts import GATE, HELD_OUT, WINDOW, load_gate_texts
from kvembed.export.gate.parity import CASES, DECIDING_HELD_OUT_TEXTS, GATE_TEXTS, HELD_OUT_TEXTS, KINDS, PARITY_TEXTS, gate_batches
from kvembed.modeling.layers.calibration import builtin_calibration_path

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_gate_texts_share_no_text_with_the_calibration_and_cover_real_input():
    calibration = {line.strip() for line in builtin_calibration_path().read_text(encoding="utf-8").splitlines()}
    texts = load_gate_texts()
    assert len(calibration) > 900 and len(texts) >= 20
    for text in texts:  # not equal to a calibration line, and no calibration line inside it
        assert text.text.strip() not in calibration
        assert not any(len(line) > 20 and line in text.text for line in calibration), text.name
    categories = {split: {t.category for t in texts if t.split == split} for split in (GATE, HELD_OUT)}
    assert {"query", "paragraph", "long", "code", "table", "numbers", "punctuation",
            "german", "french", "chinese", "russian"} <= categories[GATE]
    assert {"query", "code", "table", "numbers", "paragraph"} <= categories[HELD_OUT]
    assert len(categories[HELD_OUT] - {"query", "code", "table", "numbers", "paragraph", "mixed"}) >= 3  # languages
    longest = max((t for t in texts if t.split != WINDOW), key=lambda t: len(t.text))
    assert longest.split == GATE and len(longest.text.split()) >= 200  # a paragraph of a few hundred tokens
    # the window text: plain prose, longer still, gated only for a model with a sliding window
    [window] = [t for t in texts if t.split == WINDOW]
    assert len(window.text.split()) > 2 * len(longest.text.split()) and window.name not in GATE_TEXTS
    # the gate decides on the core and the variety texts; the held-out ones are apart
    assert set(GATE_TEXTS) == set(PARITY_TEXTS) | {t.name for t in texts if t.split == GATE}
    assert set(DECIDING_HELD_OUT_TEXTS) == {t.name for t in texts if t.split == HELD_OUT}
    assert set(HELD_OUT_TEXTS) == {t.name for t in texts if t.split == HELD_OUT and "@" not in t.name}
    assert not set(GATE_TEXTS) & set(HELD_OUT_TEXTS)
    assert not set(GATE_TEXTS.values()) & set(HELD_OUT_TEXTS.values())


def test_gate_batches_run_the_core_in_every_case_and_each_variety_group_once():
    batches = gate_batches(GATE_TEXTS)
    seen = [name for batch in batches for name in batch.names]
    assert set(seen) == set(GATE_TEXTS) and not set(seen) & set(HELD_OUT_TEXTS)
    for name in PARITY_TEXTS:
        cases = {(kind, batch.side) for batch in batches for kind, n in batch.rows if n == name}
        assert cases == set(CASES), name
    core = [batch for batch in batches if set(batch.names) <= set(PARITY_TEXTS)]
    # a batch of several core rows holds each of its texts as a query and as a document
    for batch in (b for b in core if len(b.rows) > 1):
        by_kind = {kind: [n for k, n in batch.rows if k == kind] for kind in KINDS}
        assert by_kind["query"] == by_kind["document"] and len(batch.rows) == 2 * len(by_kind["query"])
    # one row has nothing to pad: the one-row batch runs once per kind, not once per side too
    singles = sorted(batch.rows for batch in core if len(batch.rows) == 1)
    assert singles == [(("document", "sentence"),), (("query", "sentence"),)]
    variety = [n for n in GATE_TEXTS if n not in PARITY_TEXTS]
    assert all(seen.count(name) == 1 for name in variety)
    assert {(kind, batch.side) for batch in batches for kind, n in batch.rows if n in variety} == set(CASES)
    assert all(len({kind for kind, _ in batch.rows}) == 1 for batch in batches if set(batch.names) <= set(variety))
    held = gate_batches(HELD_OUT_TEXTS)
    assert sorted(n for batch in held for n in batch.names) == sorted(HELD_OUT_TEXTS)
    # two padded core batches per side, two single rows, one batch per variety group
    assert len(batches) == 2 * 2 + 2 + len({t.group for t in load_gate_texts() if t.split == GATE})


def test_a_prefixes_paragraph_is_read_at_every_second_word_as_one_batch():
    """Each held-out paragraph of the prefixes group runs as its cuts after 2, 4, ... words and
    whole (its last cut), in one padded batch with the group's other paragraphs, where the held-out
    texts decide (int8); the held-out figure of the other precisions leaves them out."""
    import json

    from kvembed.export.gate.texts import PREFIX_STEP, PREFIXES, gate_texts_path

    lines = [json.loads(line) for line in gate_texts_path().read_text(encoding="utf-8").splitlines() if line.strip()]
    paragraphs = [row for row in lines if row["group"] == PREFIXES]
    assert len(paragraphs) >= 2 and all(row["split"] == HELD_OUT for row in paragraphs)
    for row in paragraphs:
        words = row["text"].split()
        cuts = {name: text for name, text in DECIDING_HELD_OUT_TEXTS.items() if name.startswith(row["name"] + "@")}
        assert not any(name.startswith(row["name"]) for name in HELD_OUT_TEXTS)
        assert len(cuts) == -(-len(words) // PREFIX_STEP) and row["name"] not in DECIDING_HELD_OUT_TEXTS
        for name, text in cuts.items():
            count = int(name.rsplit("@", 1)[1])
            assert row["text"].startswith(text) and text.split() == words[:count], name
        assert cuts[f"{row['name']}@{len(words)}"] == row["text"]
    batches = [b for b in gate_batches(DECIDING_HELD_OUT_TEXTS) if any("@" in n for n in b.names)]
    assert len(batches) == 1 and all("@" in n for n in batches[0].names)


@pytest.fixture(scope="module")
def int8(stories_artifact):
    return stories_artifact("kv-embedding", "int8")


def test_a_real_export_records_the_held_out_worst_cosine(int8, oracle):
    """The recorded figure equals the worst cosine of the artifact's own rows on the held-out
    batches against the independent oracle (each text alone, float64 numpy)."""
    from kvembed.runtime import Embedder

    manifest = load_manifest(int8)
    held = manifest.parity.held_out
    assert held is not None and held.backend == "onnxruntime-cpu"
    assert held.texts == len(DECIDING_HELD_OUT_TEXTS) and held.rows == len(DECIDING_HELD_OUT_TEXTS)
    record = manifest.raw["parity"]["held_out"]  # the record keeps the figures beside the verdict
    assert held.decides is True and record["min_cosine_required"] == 0.99  # int8's held-out texts decide too
    assert manifest.parity.gate.texts == len(GATE_TEXTS) and record["worst_row"]["text"] in DECIDING_HELD_OUT_TEXTS
    embedder, reference = Embedder.load(int8, provider="cpu"), oracle("stories260k")
    assert manifest.method.layers == (1, 2, 3)  # the oracle is told the layer band the export resolved
    worst = 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for batch in gate_batches(DECIDING_HELD_OUT_TEXTS):
            got = embedder.run(batch.pad(embedder.encoder, DECIDING_HELD_OUT_TEXTS))[0].astype(np.float64)
            for row, (kind, name) in zip(got, batch.rows):
                want = reference.embed("kv-embedding", DECIDING_HELD_OUT_TEXTS[name], kind, layers="1-3").astype(np.float64)
                worst = min(worst, float(row @ want / np.linalg.norm(row) / np.linalg.norm(want)))
    assert held.worst_cosine == pytest.approx(worst, abs=2e-5)
    assert held.meets_bar == (held.worst_cosine >= 0.99) and 0.9 < held.worst_cosine < 1.0


def test_a_manifest_without_the_held_out_figure_still_loads(int8, tmp_path):
    data = json.loads((int8 / "kvembed.json").read_text(encoding="utf-8"))
    del data["parity"]["held_out"]
    assert Manifest.from_dict(data).parity.held_out is None
    data["parity"]["held_out"] = {"worst_cosine": "high", "rows": 1, "texts": 1, "meets_bar": True}
    with pytest.raises(InvalidInput, match="parity: held_out: worst_cosine"):
        Manifest.from_dict(data)


def test_export_prints_the_held_out_figure(tmp_path):
    from typer.testing import CliRunner

    from kvembed.cli.main import app

    out = tmp_path / "art"
    result = CliRunner().invoke(app, ["export", "--model", "stories260k", "--method", "mean", "--out", str(out),
                                      "--max-length", "64"])
    assert result.exit_code == 0, result.output
    held = load_manifest(out).parity.held_out
    printed = " ".join(result.output.split())
    assert f"held out: worst cosine {held.worst_cosine:.7f} over {held.rows} rows of {held.texts} texts" in printed
    longest = load_manifest(out).parity.gate.longest_tokens
    assert f"gate lengths: inputs up to {longest} tokens (prompt included) of max_length 64" in printed and 0 < longest <= 64
    assert "sliding window" not in printed  # the demo model has none
    shutil.rmtree(out)
