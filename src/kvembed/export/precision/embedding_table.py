"""Token-embedding tables stored at 8 bits in the int8 graph.

An LLM's token-embedding table is a large share of a small model's weights (a 256k vocabulary
at 640 wide outweighs Gemma 3 270M's whole decoder), and onnxruntime's dynamic quantisation
covers MatMul weights only, so the table would stay fp32. A table is read a few rows at a time
by a ``Gather``, so it quantises well on its own: each row symmetric int8 with one fp32 scale
(``max|row| / 127``; an all-zero row gets scale 1), and the graph gathers the int8 rows, then
dequantises only those::

    Gather(table, ids)  ->  Mul(Mul(Cast(Gather(table_int8, ids), FLOAT), Gather(scales [V, 1], ids)), columns [H])

Trained tables carry a few outlier channels, large in most rows: a row's scale then follows its
outlier and the other channels keep a handful of levels. So the columns are equalised first (each
divided by its max over the rows, relative to the median column's: the ``columns`` factors,
multiplied back after the rows are dequantised), and only then is each row quantised
(benchmarks/log/int8.md measures what this buys).

Standard ONNX ops on every backend (onnxruntime, OpenVINO). A table is a 2-D float initializer
that only ``Gather`` nodes read, as their data input along axis 0 (a tied table that a MatMul
also reads is left alone, and so is anything a graph output or a subgraph names).

:class:`EmbeddingTables` rewrites the graph without its weights and quantises each table as it
passes on its way to the data file (the ``transform`` of
:func:`~kvembed.artifact.external_data.stream_initializers`): the scales' initializer is placed
right after its table and filled as the table goes by, so no extra pass over the weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: what the manifest calls the storage of a quantised table
STORAGE = "int8, per-row scales, per-column factors"
#: rows quantised at once: bounds the temporaries of a large table
_BLOCK_ROWS = 4096


def quantize_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(int8 [V, H], fp32 scales [V, 1], fp32 columns [H])`` with ``table ~= int8 * scales *
    columns`` (module docstring); a block of rows at a time, so the temporaries stay small."""
    table = np.asarray(table, dtype=np.float32)
    columns = np.abs(table).max(axis=0)
    columns = np.where(columns > 0, columns / max(float(np.median(columns)), 1e-30), 1.0).astype(np.float32)
    values = np.empty(table.shape, dtype=np.int8)
    scales = np.empty((table.shape[0], 1), dtype=np.float32)
    for start in range(0, table.shape[0], _BLOCK_ROWS):
        rows = table[start:start + _BLOCK_ROWS] / columns
        peak = np.abs(rows).max(axis=1, keepdims=True)
        scale = np.where(peak > 0, peak / np.float32(127.0), np.float32(1.0)).astype(np.float32)
        values[start:start + _BLOCK_ROWS] = np.clip(np.rint(rows / scale), -127, 127)
        scales[start:start + _BLOCK_ROWS] = scale
    return values, scales, columns


def embedding_tables(graph: Any) -> list[str]:
    """Names of the token-embedding tables of an ``onnx.GraphProto`` (see the module docstring)."""
    import onnx

    from ..onnx_nodes import node_inputs

    readers: dict[str, list[tuple[Any, int]]] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, position))
    nested = {name for node in graph.node for name in node_inputs(node)[len(node.input):]}  # read by subgraphs
    outputs = {o.name for o in graph.output}
    found = []
    for tensor in graph.initializer:
        users = readers.get(tensor.name, [])
        if (tensor.data_type == onnx.TensorProto.FLOAT and len(tensor.dims) == 2 and users
                and tensor.name not in outputs and tensor.name not in nested
                and all(node.op_type == "Gather" and node.domain in ("", "ai.onnx") and position == 0
                        and _axis(node) == 0 for node, position in users)):
            found.append(tensor.name)
    return found


class EmbeddingTables:
    """Quantise a graph's token-embedding tables while its weights are written.

    ``rewrite(model)`` changes the graph (loaded without its weights) and returns the per-tensor
    transform that turns each table into its int8 rows and fills the scales placed after it;
    :attr:`facts` then says, for the manifest, what was stored how."""

    def __init__(self) -> None:
        self.facts: list[dict[str, Any]] = []
        self._renamed: dict[str, str] = {}  # table -> its int8 initializer
        self._scales_of: dict[str, str] = {}  # table -> its row scales initializer
        self._columns_of: dict[str, str] = {}  # table -> its column factors initializer
        self._pending: dict[str, np.ndarray] = {}  # scales / columns initializer -> its values, once its table passed

    def rewrite(self, model: Any) -> Any:
        """Rewrite ``model``'s graph in place; the transform for ``stream_initializers`` (None: no tables)."""
        from onnx import TensorProto

        graph = model.graph
        tables = set(embedding_tables(graph))
        if not tables:
            return None
        initializers = []
        for tensor in graph.initializer:
            initializers.append(tensor)
            if tensor.name in tables:
                name = tensor.name
                self._renamed[name], self._scales_of[name] = f"{name}_int8", f"{name}_scale"
                self._columns_of[name] = f"{name}_columns"
                rows = int(tensor.dims[0])
                # placeholders, filled by the transform right after the table passes
                for placeholder, dims in ((self._scales_of[name], [rows, 1]), (self._columns_of[name], [int(tensor.dims[1])])):
                    initializers.append(TensorProto(name=placeholder, data_type=TensorProto.FLOAT, dims=dims))
                self.facts.append({"name": name, "rows": rows, "width": int(tensor.dims[1]), "storage": STORAGE})
        del graph.initializer[:]
        graph.initializer.extend(initializers)
        nodes = []
        for node in graph.node:
            if node.op_type == "Gather" and node.input[0] in tables:
                nodes.extend(self._dequantising_gather(node))
            else:
                nodes.append(node)
        del graph.node[:]
        graph.node.extend(nodes)
        return self.transform

    def _dequantising_gather(self, node: Any) -> list[Any]:
        from onnx import TensorProto, helper

        table, ids = node.input[0], node.input[1]
        out, name = node.output[0], node.name or node.output[0]
        return [
            helper.make_node("Gather", [self._renamed[table], ids], [f"{out}_int8"], name=f"{name}_int8", axis=0),
            helper.make_node("Cast", [f"{out}_int8"], [f"{out}_rows"], name=f"{name}_cast", to=TensorProto.FLOAT),
            helper.make_node("Gather", [self._scales_of[table], ids], [f"{out}_scale"], name=f"{name}_scale", axis=0),
            helper.make_node("Mul", [f"{out}_rows", f"{out}_scale"], [f"{out}_scaled"], name=f"{name}_dequantize"),
            helper.make_node("Mul", [f"{out}_scaled", self._columns_of[table]], [out], name=f"{name}_columns"),
        ]

    def transform(self, tensor: Any, values: np.ndarray | None, scratch: Any = None) -> np.ndarray | None:
        """A table becomes its int8 rows (renamed); the placeholders after it get its scales and columns."""
        if tensor.name in self._renamed:
            quantized, scales, columns = quantize_rows(values)
            self._pending[self._scales_of[tensor.name]] = scales
            self._pending[self._columns_of[tensor.name]] = columns
            tensor.name = self._renamed[tensor.name]
            return quantized
        if tensor.name in self._pending:
            return self._pending.pop(tensor.name)
        return None


def _axis(node: Any) -> int:
    for attribute in node.attribute:
        if attribute.name == "axis":
            return int(attribute.i)
    return 0
