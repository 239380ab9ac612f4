"""Parquet shards: ``id`` and ``embedding`` (a fixed-size list of float32/float16, or of the int8 /
uint8 values of a quantized vector type: ``ceil(dim / 8)`` bytes for binary and ubinary), written atomically.

A shard is written to a ``.partial-*`` file, one row group per chunk, and renamed into place
when complete; its statistics (rows, tokens, truncated, skipped) ride in the Parquet footer's
key-value metadata, so a resumed run totals finished shards without reading their vectors.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..runtime.quantize import width_of
from .plan import PARTIAL_MARK

STATS_KEY = "kvembed.corpus"


#: ``--output-dtype`` -> the Arrow type of the embedding's values
VALUE_TYPES = {"float32": pa.float32(), "float16": pa.float16(), "int8": pa.int8(), "uint8": pa.uint8(),
               "binary": pa.int8(), "ubinary": pa.uint8()}


def row_width(dim: int, dtype: str) -> int:
    """Values per embedding for ``dtype``: ``dim``, or its packed bytes for binary and ubinary."""
    return dim if dtype.startswith("float") else width_of(dtype, dim)


def shard_schema(id_type: str, dim: int, dtype: str) -> pa.Schema:
    value = VALUE_TYPES[dtype]
    return pa.schema([("id", pa.int64() if id_type == "int64" else pa.string()), ("embedding", pa.list_(value, row_width(dim, dtype)))])


class ShardWriter:
    """Streams chunks into one shard; :meth:`commit` publishes it, :meth:`abort` leaves nothing."""

    def __init__(self, path: Path, id_type: str, dim: int, dtype: str) -> None:
        self.path = Path(path)
        self.dim, self.dtype = row_width(dim, dtype), np.dtype(VALUE_TYPES[dtype].to_pandas_dtype())
        self.partial = self.path.with_name(f"{self.path.name}{PARTIAL_MARK}{uuid.uuid4().hex[:8]}")
        self.schema = shard_schema(id_type, dim, dtype)
        self.writer = pq.ParquetWriter(self.partial, self.schema)

    def write(self, ids: list[Any], vectors: np.ndarray) -> None:
        if len(ids) == 0:
            return
        flat = pa.array(np.ascontiguousarray(vectors, dtype=self.dtype).reshape(-1))
        embedding = pa.FixedSizeListArray.from_arrays(flat, self.dim)
        self.writer.write_table(pa.Table.from_arrays([pa.array(ids, self.schema.field("id").type), embedding], schema=self.schema))

    def commit(self, stats: dict[str, Any]) -> None:
        self.writer.add_key_value_metadata({STATS_KEY: json.dumps(stats)})
        self.writer.close()
        os.replace(self.partial, self.path)

    def abort(self) -> None:
        try:
            self.writer.close()
        finally:
            self.partial.unlink(missing_ok=True)


def read_stats(path: Path) -> dict[str, Any] | None:
    """A finished shard's statistics; None when the file is not a complete shard of this tool."""
    try:
        metadata = pq.read_metadata(path).metadata or {}
    except (pa.ArrowInvalid, OSError):
        return None
    raw = metadata.get(STATS_KEY.encode())
    return None if raw is None else json.loads(raw)
