"""Vector types (int8, uint8, binary, ubinary): ``quantize`` against a computation written here, the
ranges an export stores (those of the artifact's own vectors), a hostile ``vector_ranges`` refused,
an old artifact measuring them at load, ``encode(precision=)``, ``kvembed embed --precision`` and
``embed-corpus --output-dtype``."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kvembed.artifact import Manifest, load_manifest
from kvembed.cli.main import app
from kvembed.corpus import CorpusError, CorpusOptions, embed_corpus
from kvembed.errors import InvalidInput
from kvembed.runtime import Embedder
from kvembed.runtime.quantize import VECTOR_TYPES, calibration_ranges, quantize, unpack_binary

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CALIBRATION = Path(__file__).resolve().parents[1] / "src" / "kvembed" / "data" / "calibration.txt"
ALSO = ("last=kv-embedding:pooling=last",)
TEXTS = ["A man is playing a guitar.", "hi", "Why is the sky blue?", "Stock markets fell sharply today.", ""]


# -- the independent computation -----------------------------------------------------------------


def levels_by_hand(vectors: np.ndarray, ranges: np.ndarray, signed: bool) -> np.ndarray:
    """sentence-transformers' levels, one value at a time: ``floor((x - min) / step)`` in float32 with
    ``step = (max - min) / 255`` (1 where min == max), clipped into 0..255; int8 is that minus 128."""
    out = np.zeros(vectors.shape, dtype=np.int64)
    for i, row in enumerate(vectors):
        for j, x in enumerate(row):
            low, high = np.float32(ranges[0, j]), np.float32(ranges[1, j])
            step = (high - low) / np.float32(255)
            step = np.float32(1) if step == 0 else step
            level = int(np.floor((np.float32(x) - low) / step))
            out[i, j] = min(255, max(0, level)) - (128 if signed else 0)
    return out


def bits_by_hand(vectors: np.ndarray) -> np.ndarray:
    """One bit per dimension, set where the value is positive, eight to a byte, the first in the
    highest bit, the last byte padded with zeros: bytes 0..255."""
    width = (vectors.shape[1] + 7) // 8
    out = np.zeros((len(vectors), width), dtype=np.int64)
    for i, row in enumerate(vectors):
        for j, x in enumerate(row):
            if x > 0:
                out[i, j // 8] += 1 << (7 - j % 8)
    return out


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


def test_quantize_matches_a_computation_by_hand() -> None:
    rng = np.random.default_rng(0)
    dim = 20  # not a multiple of eight: the last byte is padded
    calibration = unit(rng.normal(size=(50, dim)))
    ranges = calibration_ranges(calibration)
    assert np.array_equal(ranges, np.stack([calibration.min(0), calibration.max(0)]))
    ranges[:, 3] = 0.25  # a dimension whose min equals its max: step 1
    vectors = unit(rng.normal(size=(12, dim)))
    vectors[0] = 0.0
    vectors[1, :4] = [-1.0, 1.0, 0.9, 0.0]  # far outside the ranges: clipped, never wrapped
    assert np.array_equal(quantize(vectors, "uint8", ranges), levels_by_hand(vectors, ranges, signed=False))
    assert np.array_equal(quantize(vectors, "int8", ranges), levels_by_hand(vectors, ranges, signed=True))
    assert quantize(vectors, "uint8", ranges).dtype == np.uint8 and quantize(vectors, "int8", ranges).dtype == np.int8
    assert np.array_equal(quantize(vectors, "ubinary"), bits_by_hand(vectors))
    assert np.array_equal(quantize(vectors, "binary"), bits_by_hand(vectors) - 128)
    assert quantize(vectors, "binary").shape == (12, 3) and quantize(vectors, "binary").dtype == np.int8
    assert np.array_equal(quantize(vectors, "float"), vectors) and quantize(vectors[0], "ubinary").shape == (3,)
    assert np.array_equal(unpack_binary(quantize(vectors, "binary"), dim), np.where(vectors > 0, 1.0, -1.0))
    try:  # the library the types come from, where it is installed: the same bytes (inside its ranges)
        from sentence_transformers.quantization import quantize_embeddings
    except ImportError:
        return
    inside = np.clip(vectors, ranges[0], ranges[1])
    for kind in ("int8", "uint8", "binary", "ubinary"):
        assert np.array_equal(quantize(inside, kind, ranges), quantize_embeddings(inside, kind, ranges=ranges)), kind


def test_quantize_refuses_what_it_cannot_do() -> None:
    vectors = unit(np.ones((2, 8)))
    with pytest.raises(InvalidInput, match="did you mean 'int8'"):
        quantize(vectors, "int4")
    with pytest.raises(InvalidInput, match="needs the per-dimension ranges"):
        quantize(vectors, "int8")
    with pytest.raises(InvalidInput, match=r"finite \(2, 8\)"):
        quantize(vectors, "uint8", np.zeros((2, 7)))
    with pytest.raises(InvalidInput, match="float vectors"):
        quantize(vectors.astype(np.int8), "binary")
    assert VECTOR_TYPES == ("float", "int8", "uint8", "binary", "ubinary")


# -- an artifact's ranges --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def artifact(stories_artifact) -> Path:
    """The demo model's kv-embedding artifact with an ``--also`` output, exported by this session."""
    return stories_artifact("kv-embedding", also=ALSO)


@pytest.fixture(scope="module")
def embedder(artifact) -> Embedder:
    return Embedder.load(artifact, provider="cpu")


def calibration_rows(embedder: Embedder, output: str | None, count: int) -> np.ndarray:
    lines = list(dict.fromkeys(line.strip() for line in CALIBRATION.read_text(encoding="utf-8").splitlines() if line.strip()))
    return np.concatenate([embedder.encode(lines[:count], kind=kind, output=output) for kind in ("query", "document")])


def test_the_export_stores_the_ranges_of_its_own_vectors(artifact, embedder) -> None:
    stored = json.loads((artifact / "kvembed.json").read_text(encoding="utf-8"))["vector_ranges"]
    assert set(stored) == {"embedding", "embedding.last"}
    for name, output in (("embedding", None), ("embedding.last", "last")):
        rows = calibration_rows(embedder, output, stored[name]["texts"])
        assert stored[name]["texts"] >= 32 and len(stored[name]["min"]) == embedder.dim_of(output)
        np.testing.assert_allclose(stored[name]["min"], rows.min(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(stored[name]["max"], rows.max(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(embedder.vector_ranges(output), np.array([stored[name]["min"], stored[name]["max"]], np.float32))


def hostile(data: dict, change) -> dict:
    data = json.loads(json.dumps(data))
    change(data["vector_ranges"])
    return data


@pytest.mark.parametrize("change, says", [
    (lambda r: r["embedding"]["min"].pop(), "must be a list of 64 numbers"),
    (lambda r: r["embedding"]["max"].__setitem__(2, float("nan")), r"max\[2\] must be a finite number"),
    (lambda r: r["embedding"]["min"].__setitem__(0, "0.1"), r"min\[0\] must be a finite number"),
    (lambda r: r["embedding"]["min"].__setitem__(0, True), r"min\[0\] must be a finite number"),
    (lambda r: r["embedding"].__setitem__("max", "nope"), "must be a list of 64 numbers"),
    (lambda r: r["embedding"]["min"].__setitem__(5, 9.0), r"min\[5\] 9.0 is above max\[5\]"),
    (lambda r: r.__setitem__("pooled", r["embedding"]), "names no normalised output"),
    (lambda r: r.__setitem__("../../x", 1), "names no normalised output"),
    (lambda r: r["embedding"].__setitem__("texts", -3), "texts must be a positive integer"),
    (lambda r: r.__setitem__("embedding", [1, 2]), "must be an object with min, max"),
], ids=["short", "nan", "string", "bool", "not-a-list", "min-above-max", "pooled", "odd-name", "texts", "not-an-object"])
def test_a_hostile_vector_ranges_is_refused_in_one_line(artifact, change, says) -> None:
    data = json.loads((artifact / "kvembed.json").read_text(encoding="utf-8"))
    assert len(data["vector_ranges"]["embedding"]["min"]) == 64  # the demo model's width, as the messages say
    with pytest.raises(InvalidInput, match=says) as refused:
        Manifest.from_dict(hostile(data, change))
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 300


def test_a_nan_in_the_file_is_refused_at_load(artifact, tmp_path) -> None:
    copy = Path(shutil.copytree(artifact, tmp_path / "a"))
    path = copy / "kvembed.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["vector_ranges"]["embedding"]["min"][0] = float("nan")
    path.write_text(json.dumps(data), encoding="utf-8")  # Python's json writes NaN, and reads it back
    with pytest.raises(InvalidInput, match="finite number"):
        load_manifest(copy)


def test_an_old_artifact_measures_its_ranges_at_load(artifact, embedder, tmp_path) -> None:
    copy = Path(shutil.copytree(artifact, tmp_path / "old"))
    path = copy / "kvembed.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    del data["vector_ranges"]
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    old = Embedder.load(copy, provider="cpu")
    assert not old.artifact.vector_ranges and "vector_ranges" not in old.manifest
    with pytest.warns(UserWarning, match="no vector_ranges.*re-export"):
        measured = old.vector_ranges("last")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # measured once: no second warning
        main = old.vector_ranges()
    np.testing.assert_allclose(measured, embedder.vector_ranges("last"), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(main, embedder.vector_ranges(), rtol=1e-5, atol=1e-6)


def test_encode_gives_each_vector_type(embedder) -> None:
    floats = embedder.encode(TEXTS)
    ranges = embedder.vector_ranges()
    assert np.array_equal(embedder.encode(TEXTS, precision="float32"), floats)
    assert np.array_equal(embedder.encode(TEXTS, precision="float"), floats)
    assert np.array_equal(embedder.encode(TEXTS, precision="uint8"), levels_by_hand(floats, ranges, signed=False))
    assert np.array_equal(embedder.encode(TEXTS, precision="int8"), levels_by_hand(floats, ranges, signed=True))
    assert np.array_equal(embedder.encode(TEXTS, precision="ubinary"), bits_by_hand(floats))
    binary = embedder.encode(TEXTS, precision="binary")
    assert binary.dtype == np.int8 and binary.shape == (len(TEXTS), embedder.dim // 8)
    assert np.array_equal(binary, bits_by_hand(floats) - 128)
    last = embedder.encode(TEXTS, output="last", precision="int8")
    assert np.array_equal(last, levels_by_hand(embedder.encode(TEXTS, output="last"), embedder.vector_ranges("last"), signed=True))
    assert embedder.encode_query("hi", precision="ubinary").shape == (embedder.dim // 8,)
    with pytest.raises(InvalidInput, match="needs normalize=True"):
        embedder.encode(TEXTS, precision="int8", normalize=False)
    with pytest.raises(InvalidInput, match="precision must be one of.*did you mean 'ubinary'"):
        embedder.encode(TEXTS, precision="ubinry")


# -- the command line and corpus jobs ----------------------------------------------------------------


def test_embed_precision_binary_writes_packed_bytes(artifact, embedder, tmp_path) -> None:
    out = tmp_path / "v.npy"
    result = CliRunner().invoke(app, ["embed", str(artifact), *TEXTS[:3], "--precision", "binary", "-o", str(out)])
    assert result.exit_code == 0, result.output
    written = np.load(out)
    assert written.dtype == np.int8 and written.shape == (3, embedder.dim // 8)
    assert np.array_equal(written, bits_by_hand(embedder.encode(TEXTS[:3])) - 128)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS[:3]) + "\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["embed", str(artifact), "-i", str(texts), "-o", str(tmp_path / "v.jsonl"), "--precision", "ubinary"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line)["embedding"] for line in (tmp_path / "v.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows == bits_by_hand(embedder.encode(TEXTS[:3])).tolist()
    refused = CliRunner().invoke(app, ["embed", str(artifact), "hi", "--precision", "int4"])
    assert refused.exit_code == 2 and "did you mean 'int8'" in refused.output


@pytest.mark.parametrize("dtype, value_type, width", [("int8", pa.int8(), 64), ("binary", pa.int8(), 8), ("ubinary", pa.uint8(), 8)])
def test_embed_corpus_writes_quantized_parquet(artifact, embedder, tmp_path, dtype, value_type, width) -> None:
    texts = [f"{text} number {i}" for i, text in enumerate(TEXTS * 6)]
    (tmp_path / "docs.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    summary = embed_corpus(CorpusOptions(artifact, [str(tmp_path / "docs.txt")], out, output_dtype=dtype, rows_per_file=20, progress=False))
    table = pa.concat_tables([pq.read_table(path) for path in sorted(out.glob("part-*.parquet"))])
    assert table.schema.field("embedding").type == pa.list_(value_type, width)
    written = np.array(table.column("embedding").to_pylist())
    expected = embedder.encode(texts, precision=dtype).astype(np.int64)
    # the corpus batches otherwise: a float a hair off a level's edge may land one level over
    assert written.shape == expected.shape and np.abs(written - expected).max() <= (1 if dtype == "int8" else 0)
    record = summary["embedding"]
    assert record["dtype"] == dtype and record["vector_type"] == dtype and record["width"] == width
    if dtype == "int8":
        assert record["ranges"]["min"] == json.loads((artifact / "kvembed.json").read_text())["vector_ranges"]["embedding"]["min"]
        assert "manifest" in record["ranges"]["from"]
    else:
        assert "packbits" in record["packing"]
    other = "uint8" if dtype != "uint8" else "int8"
    with pytest.raises(CorpusError, match="different output dtype"):
        embed_corpus(CorpusOptions(artifact, [str(tmp_path / "docs.txt")], out, output_dtype=other, rows_per_file=20, resume=True,
                                   progress=False))
