"""The int8 artifact's token-embedding table: int8 rows with an fp32 scale per row after the
columns are equalised (fp32 factors per column), gathered then dequantised in the graph; the fp16 artifact's table is fp16. Checked from the written files
against a numpy quantisation of the model's own fp32 table, and on onnxruntime and OpenVINO
against the independent oracle, on a tied (the demo model) and an untied (tiny Llama) model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from safetensors.numpy import load_file

from checks import assert_matches_oracle
from conftest import TEXTS
from kvembed.artifact import read_manifest
from kvembed.export.precision.embedding_table import EmbeddingTables, embedding_tables
from kvembed.artifact.external_data import stream_initializers
from kvembed.export.precision.convert import INT8_RECIPES, to_int8
from kvembed.methods import demo_model_path
from kvembed import OpenVINOOptions
from kvembed.runtime import Embedder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: the demo model's default kv-embedding layers (the shared artifacts use the default)
STORIES_LAYERS = "1-3"


@pytest.fixture(scope="module")
def int8_artifacts(stories_artifact, traces, tiny_models, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """name -> (int8 artifact, the model folder): the demo model (tied embeddings) and the tiny
    Llama (untied), both through the exporter's default recipes and parity gate."""
    untied = traces.get(tiny_models["llama"], "kv-embedding").write(tmp_path_factory.mktemp("llama") / "int8", "int8")
    return {"stories260k": (stories_artifact("kv-embedding", "int8"), demo_model_path()),
            "llama": (untied.path, tiny_models["llama"])}


def _table(folder: Path) -> np.ndarray:
    return load_file(str(folder / "model.safetensors"))["model.embed_tokens.weight"].astype(np.float32)


def _initializers(path: Path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


@pytest.mark.parametrize("name", ["stories260k", "llama"])
def test_the_int8_table_holds_each_row_at_8_bits_with_its_scale(int8_artifacts, name):
    artifact, folder = int8_artifacts[name]
    config_tied = name == "stories260k"
    assert config_tied == ("lm_head.weight" not in load_file(str(folder / "model.safetensors")))
    want = _table(folder)
    model = onnx.load(str(artifact / "model.onnx"))
    tensors = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    # the graph: Gather(int8 table, ids) -> Cast(FLOAT) -> Mul(Gather(scales [V, 1], ids)) -> Mul(columns [H])
    producers = {o: n for n in model.graph.node for o in n.output}
    gathers = [n for n in model.graph.node if n.op_type == "Gather" and n.input[0] in tensors
               and tensors[n.input[0]].dtype == np.int8]
    assert len(gathers) == 1
    table, ids = gathers[0].input
    (cast,) = [n for n in model.graph.node if n.input[:1] == gathers[0].output[:1]]
    assert cast.op_type == "Cast" and helper.get_attribute_value(cast.attribute[0]) == onnx.TensorProto.FLOAT
    (mul,) = [n for n in model.graph.node if cast.output[0] in n.input]
    scale_gather = producers[[i for i in mul.input if i != cast.output[0]][0]]
    assert mul.op_type == "Mul" and scale_gather.op_type == "Gather" and scale_gather.input[1] == ids
    scales = tensors[scale_gather.input[0]]
    (column_mul,) = [n for n in model.graph.node if mul.output[0] in n.input]
    assert column_mul.op_type == "Mul"
    columns = tensors[[i for i in column_mul.input if i != mul.output[0]][0]]
    assert columns.shape == (want.shape[1],) and columns.dtype == np.float32
    assert tensors[table].shape == want.shape and scales.shape == (want.shape[0], 1) and scales.dtype == np.float32
    # no fp32 copy of the table is left
    assert not [k for k, v in tensors.items() if v.shape == want.shape and v.dtype != np.int8]
    # independently: columns divided by their max relative to the median column's, then each row
    # quantised symmetric int8 with scale max|row| / 127
    column_max = np.abs(want.astype(np.float64)).max(axis=0)
    want_columns = column_max / np.median(column_max)
    np.testing.assert_allclose(columns, want_columns, rtol=1e-6)
    equalised = want / want_columns
    peak = np.abs(equalised).max(axis=1, keepdims=True)
    want_scales = np.where(peak > 0, peak / 127.0, 1.0)
    want_values = np.clip(np.round(equalised / want_scales), -127, 127)
    np.testing.assert_allclose(scales, want_scales, rtol=1e-5)
    values = tensors[table].astype(np.int32)
    assert np.abs(values - want_values).max() <= 1 and (values != want_values).mean() < 1e-3  # ties may round apart
    step = want_scales * want_columns  # one int8 level of each weight
    dequantised = values * scales * columns
    assert (np.abs(dequantised - want) <= 0.5001 * step + 1e-7).mean() > 0.999
    assert (np.abs(dequantised - want) <= 1.0001 * step + 1e-7).all()
    # the manifest records it, and the gate passed
    manifest = read_manifest(artifact)
    (fact,) = manifest["graph"]["precision_conversion"]["embedding_tables"]
    assert fact["rows"] == want.shape[0] and fact["width"] == want.shape[1] and fact["storage"] == "int8, per-row scales, per-column factors"
    assert manifest["parity"]["passed"] and manifest["parity"]["worst_cosine"] >= 0.99


@pytest.mark.parametrize("name", ["stories260k", "llama"])
@pytest.mark.parametrize("provider", ["cpu", "openvino"])
def test_onnxruntime_and_openvino_run_it_and_match_the_oracle(int8_artifacts, oracle, name, provider):
    artifact, folder = int8_artifacts[name]
    options = OpenVINOOptions(precision="f32") if provider == "openvino" else None
    embedder = Embedder.load(artifact, provider=provider, threads=1, options=options)
    layers = {"layers": STORIES_LAYERS} if name == "stories260k" else {}
    assert_matches_oracle(embedder.encode, oracle(name), "kv-embedding", TEXTS, precision="int8",
                          what=f"{name} {provider}", **layers)


def test_the_table_costs_a_quarter_and_the_recipe_can_keep_it_fp32(stories_artifact, tmp_path):
    """The same recipe with and without the table at 8 bits: the files differ by three of the
    table's four bytes per weight, less its scales and column factors; the opt-out leaves the
    fp32 table read directly."""
    graph = stories_artifact("kv-embedding") / "model.onnx"
    plain = INT8_RECIPES["plain"]
    with_table = to_int8(graph, tmp_path / "table.onnx", plain)
    without = to_int8(graph, tmp_path / "fp32-table.onnx", dataclasses.replace(plain, name="plain-fp32-table",
                                                                               int8_tables=False))
    rows, width = _table(demo_model_path()).shape
    saved = (tmp_path / "fp32-table.onnx").stat().st_size - (tmp_path / "table.onnx").stat().st_size
    assert abs(saved - (3 * rows * width - 4 * rows - 4 * width)) < 0.02 * rows * width  # less scales and columns
    assert without["embedding_tables"] == [] and len(with_table["embedding_tables"]) == 1
    kept = _initializers(tmp_path / "fp32-table.onnx")
    assert [k for k, v in kept.items() if v.shape == (rows, width) and v.dtype == np.float32]


def test_the_fp16_table_is_fp16(stories_artifact):
    model = onnx.load(str(stories_artifact("kv-embedding", "fp16") / "model.onnx"))
    tensors = {t.name: t for t in model.graph.initializer}
    tables = [tensors[n.input[0]] for n in model.graph.node if n.op_type == "Gather" and n.input[0] in tensors
              and len(tensors[n.input[0]].dims) == 2]
    assert [list(t.dims) for t in tables] == [list(_table(demo_model_path()).shape)]
    assert tables[0].data_type == onnx.TensorProto.FLOAT16


def _graph(readers: list[tuple[str, list[str], dict]], table: np.ndarray) -> onnx.ModelProto:
    """A small graph over one table: each reader (op, inputs, attributes) gives one output."""
    nodes = [helper.make_node(op, inputs, [f"y{i}"], name=f"n{i}", **attrs) for i, (op, inputs, attrs) in enumerate(readers)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, ["n"]),
                     helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", table.shape[0]])],
        [helper.make_tensor_value_info(f"y{i}", onnx.TensorProto.FLOAT, ["n", "m"]) for i in range(len(readers))],
        [numpy_helper.from_array(table, "table")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("readers,found", [
    ([("Gather", ["table", "ids"], {}), ("Gather", ["table", "ids"], {"axis": 0})], ["table"]),
    ([("Gather", ["table", "ids"], {}), ("MatMul", ["x", "table"], {})], []),  # tied: a MatMul reads it too
    ([("Gather", ["table", "ids"], {"axis": 1})], []),  # columns, not rows
])
def test_only_tables_read_row_wise_by_gathers_alone_are_quantised(readers, found):
    assert embedding_tables(_graph(readers, np.ones((5, 3), np.float32)).graph) == found


def test_a_zero_row_gets_a_unit_scale_and_shared_gathers_one_table(tmp_path):
    """Two Gathers of one table share its int8 rows, scales and column factors; an all-zero row or
    column dequantises to zeros."""
    import onnxruntime as ort

    table = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    table[2] = 0.0
    table[:, 1] = 0.0
    model = _graph([("Gather", ["table", "ids"], {}), ("Gather", ["table", "ids"], {})], table)
    tables = EmbeddingTables()
    transform = tables.rewrite(model)
    stream_initializers(model, tmp_path, tmp_path / "model.onnx", transform)  # as the int8 conversion streams them
    model = onnx.load(str(tmp_path / "model.onnx"))
    onnx.checker.check_model(model)
    stored = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert sorted((v.dtype.name, v.shape) for v in stored.values()) == [("float32", (4,)), ("float32", (6, 1)),
                                                                          ("int8", (6, 4))]
    scales, columns = (next(v for v in stored.values() if v.shape == shape) for shape in ((6, 1), (4,)))
    assert scales[2, 0] == 1.0 and columns[1] == 1.0 and np.isfinite(scales).all() and np.isfinite(columns).all()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.array([2, 0, 5, -1], dtype=np.int64)
    first, second = session.run(["y0", "y1"], {"ids": ids, "x": np.zeros((4, 6), np.float32)})
    np.testing.assert_array_equal(first, second)
    assert (first[0] == 0).all() and (first[:, 1] == 0).all()
    np.testing.assert_allclose(first, table[ids], atol=np.abs(table).max() / 127 + 1e-7)
