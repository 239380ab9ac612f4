"""Input files: find them (paths, directories, globs), check them, count their rows, read row ranges.

Parquet is read with pyarrow, only the id and text columns and only the row groups a shard
needs, so a wide table or a huge file is never loaded whole. TXT (one text per line) and JSONL
(one object or string per line) are read as bytes from the shard's byte offset, so no shard
rescans the lines before it. Every bad record goes through :class:`RecordPolicy`: it fails
naming the file and line/row, or (``--on-error skip``) is counted and kept as an example.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .options import DEFAULT_ID_COLUMN, FORMATS, CorpusError
from ..runtime.encoding import unicode_problem

SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".txt": "txt"}
#: rows read (and embedded) at a time inside a shard: bounds memory, whatever the shard size
CHUNK_ROWS = 4096
#: examples of skipped records kept per shard (all of them are counted)
SKIP_EXAMPLES = 20
#: records of every input read before a run records itself in --output (:func:`check_first_records`)
FIRST_RECORDS = 100


@dataclass(frozen=True)
class InputFile:
    """One input file as planned: ``rows`` counts lines (TXT/JSONL) or rows (Parquet);
    ``offsets[k]`` is the byte offset of line ``k * rows_per_file`` (TXT/JSONL only)."""

    path: str
    name: str
    format: str
    bytes: int
    rows: int
    offsets: tuple[int, ...] = ()

    def where(self, row: int) -> str:
        """How messages point at a record: ``file:line`` (1-based) or ``file row N`` (0-based)."""
        return f"{self.path} row {row}" if self.format == "parquet" else f"{self.path}:{row + 1}"

    def row_id(self, row: int) -> str:
        """The stable id of a record when the input has no id column."""
        return f"{self.name}:{row}" if self.format == "parquet" else f"{self.name}:{row + 1}"


@dataclass(frozen=True)
class Columns:
    """Which fields hold the text and the id (``id=None``: stable row ids); ``id_type`` is the
    output's arrow id type name, ``"string"`` or ``"int64"``."""

    text: str
    id: str | None
    id_type: str = "string"


@dataclass
class Rows:
    """A chunk of records read from one shard's range; ``span`` input rows were consumed for it
    (records, blank JSONL lines and skipped records alike; skips are in the policy)."""

    ids: list[Any] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    span: int = 0
    #: each record's row in its file (for messages about it, as RecordPolicy names rows)
    rows: list[int] = field(default_factory=list)


class RecordPolicy:
    """``--on-error``: raise on the first bad record, or count it and keep a few examples."""

    def __init__(self, on_error: str) -> None:
        self.skip = on_error == "skip"
        self.count = 0
        self.examples: list[dict[str, Any]] = []

    def bad(self, file: InputFile, row: int, reason: str) -> None:
        if not self.skip:
            raise CorpusError(f"{file.where(row)}: {reason}; fix the record or pass --on-error skip")
        self.count += 1
        if len(self.examples) < SKIP_EXAMPLES:
            self.examples.append({"file": file.path, "row": row, "where": file.where(row), "reason": reason})


# -- finding and checking files ------------------------------------------------------------------


def find_files(patterns: tuple[str, ...], format: str | None) -> list[tuple[str, str]]:
    """``(absolute path, format)`` of every file the patterns name, sorted, without duplicates.

    A pattern is a file, a directory (its files with a known suffix; names starting with ``_``
    or ``.`` are left out) or a glob (``**`` recurses).
    """
    found: dict[str, str] = {}
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
        if not matches:
            raise CorpusError(f"no input file matches {pattern!r}")
        for match in matches:
            if os.path.isdir(match):
                inside = [os.path.join(match, n) for n in sorted(os.listdir(match)) if not n.startswith(("_", "."))]
                files = [p for p in inside if os.path.isfile(p) and (format or _suffix_format(p))]
                if not files:
                    raise CorpusError(f"directory {match!r} holds no .parquet, .jsonl or .txt file")
            else:
                files = [match]
            for path in files:
                found.setdefault(os.path.abspath(path), format or _format_of(path))
    formats = sorted(set(found.values()))
    if len(formats) > 1:
        raise CorpusError(f"--input mixes formats ({', '.join(formats)}); embed each format in its own run")
    return sorted(found.items())


def _suffix_format(path: str) -> str | None:
    return SUFFIXES.get(Path(path).suffix.lower())


def _format_of(path: str) -> str:
    fmt = _suffix_format(path)
    if fmt is None:
        raise CorpusError(f"cannot tell the format of {path!r} from its suffix; pass --format {'|'.join(FORMATS)}")
    return fmt


def row_names(paths: list[str]) -> dict[str, str]:
    """Short, stable file names for row ids: paths relative to the inputs' common directory."""
    if len(paths) == 1:
        return {paths[0]: os.path.basename(paths[0])}
    common = os.path.commonpath([os.path.dirname(p) for p in paths])
    return {p: os.path.relpath(p, common) for p in paths}


def scan_file(path: str, name: str, format: str, rows_per_file: int) -> InputFile:
    """Count a file's rows (and, for text formats, note where every shard starts)."""
    size = os.path.getsize(path)
    if format == "parquet":
        return InputFile(path, name, format, size, _parquet_file(path).metadata.num_rows)
    offsets, lines, position = [0], 0, 0
    with open(path, "rb") as handle:
        for line in handle:
            position += len(line)
            lines += 1
            if lines % rows_per_file == 0:
                offsets.append(position)
    if offsets[-1] == position and len(offsets) > 1:
        offsets.pop()  # the last shard boundary fell at the very end of the file
    return InputFile(path, name, format, size, lines, tuple(offsets))


def _parquet_file(path: str) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise CorpusError(f"{path} is not a readable Parquet file ({err}); check the file or its --format") from None


def resolve_columns(files: list[InputFile], text: str, id_column: str | None) -> Columns:
    """Check every file has the columns asked for and decide where ids come from.

    An explicit ``--id-column`` must exist everywhere. By default a column named ``id`` is used
    when every file has one (JSONL: its first record has the key), row ids when none has.
    """
    if not files:
        raise CorpusError("no input rows: every input file was empty")
    fmt = files[0].format
    if fmt == "txt":
        if id_column is not None:
            raise CorpusError("TXT input has no columns: drop --id-column (rows get ids file:line)")
        return Columns(text, None)
    wanted = id_column or DEFAULT_ID_COLUMN
    has_id = {f.path: _has_column(f, wanted, text) for f in files}
    if id_column is None and not any(has_id.values()):
        return Columns(text, None)
    missing = [path for path, present in has_id.items() if not present]
    if missing:
        how = "pass another --id-column" if id_column else f"add an {wanted!r} column everywhere or to none"
        more = f" (nor have {len(missing) - 1} more files)" if len(missing) > 1 else ""
        raise CorpusError(f"{missing[0]} has no {wanted!r} id column{more}; {how}")
    if fmt == "jsonl":
        return Columns(text, wanted, "string")
    example: dict[str, str] = {}  # id type -> first file with it
    for f in files:
        example.setdefault(_parquet_id_kind(f, wanted), f.path)
    if len(example) > 1:
        (kind_a, path_a), (kind_b, path_b) = list(example.items())[:2]
        raise CorpusError(f"the id column {wanted!r} is {kind_a} in {path_a} but {kind_b} in {path_b}; give every file one id type")
    return Columns(text, wanted, next(iter(example)))


def _has_column(file: InputFile, column: str, text: str) -> bool:
    """Whether ``file`` has ``column`` (and, checked on the way, the text column)."""
    if file.format == "parquet":
        import pyarrow as pa

        schema = _parquet_file(file.path).schema_arrow
        if text not in schema.names:
            raise CorpusError(
                f"{file.path} has no {text!r} column (columns: {', '.join(schema.names)}); pass --text-column"
            )
        kind = schema.field(text).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
            raise CorpusError(f"column {text!r} of {file.path} is {kind}, expected strings; pass the text column as --text-column")
        return column in schema.names
    sample = _json_sample(file, FIRST_RECORDS)
    objects = [item for item in sample if isinstance(item, dict)]
    if objects and not any(text in item for item in objects):
        keys = sorted({key for item in objects for key in item})
        raise CorpusError(
            f"{file.path} has no {text!r} key in its first {len(objects)} objects (keys: {', '.join(keys[:20])}); pass --text-column"
        )
    return bool(sample) and isinstance(sample[0], dict) and column in sample[0]  # the first record decides


def _json_sample(file: InputFile, count: int) -> list[Any]:
    """The first ``count`` records of a JSONL file, parsed (None for a line that is not JSON)."""
    records: list[Any] = []
    with open(file.path, "rb") as handle:
        for line in handle:
            if line.strip():
                try:
                    records.append(json.loads(line))
                except (ValueError, UnicodeDecodeError, RecursionError):
                    records.append(None)
                if len(records) == count:
                    break
    return records


def _parquet_id_kind(file: InputFile, column: str) -> str:
    import pyarrow as pa

    kind = _parquet_file(file.path).schema_arrow.field(column).type
    if pa.types.is_integer(kind):
        return "int64"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return "string"
    raise CorpusError(f"id column {column!r} of {file.path} is {kind}; ids must be strings or integers")


def check_first_records(files: list[InputFile], columns: Columns, on_error: str) -> None:
    """Read the first :data:`FIRST_RECORDS` records of every file under the ``--on-error`` policy,
    so a bad record near the top fails before the run writes anything to --output."""
    for file in files:
        policy = RecordPolicy(on_error)
        for _ in read_rows(file, 0, min(FIRST_RECORDS, file.rows), 0, columns, policy):
            pass


# -- reading a shard's rows -----------------------------------------------------------------------


def read_rows(
    file: InputFile, start: int, stop: int, byte_start: int, columns: Columns, policy: RecordPolicy
) -> Iterator[Rows]:
    """Records ``start <= row < stop`` of ``file`` in chunks of :data:`CHUNK_ROWS`."""
    if file.format == "parquet":
        yield from _read_parquet(file, start, stop, columns, policy)
    else:
        yield from _read_lines(file, start, stop, byte_start, columns, policy)


def _read_parquet(file: InputFile, start: int, stop: int, columns: Columns, policy: RecordPolicy) -> Iterator[Rows]:
    parquet = _parquet_file(file.path)
    groups, first, offset = [], None, 0
    for index in range(parquet.metadata.num_row_groups):
        size = parquet.metadata.row_group(index).num_rows
        if offset < stop and offset + size > start:
            groups.append(index)
            first = offset if first is None else first
        offset += size
    if not groups:
        return
    names = [columns.text] + ([columns.id] if columns.id else [])
    row = first
    for batch in parquet.iter_batches(batch_size=CHUNK_ROWS, row_groups=groups, columns=names, use_threads=False):
        lo, hi = max(start - row, 0), min(stop - row, batch.num_rows)
        if lo < hi:
            texts = batch.column(columns.text).slice(lo, hi - lo).to_pylist()
            ids = batch.column(columns.id).slice(lo, hi - lo).to_pylist() if columns.id else None
            chunk = Rows(span=hi - lo)
            for k, text in enumerate(texts):
                at = row + lo + k
                if text is None:
                    policy.bad(file, at, f"{columns.text!r} is null")
                elif ids is not None and ids[k] is None:
                    policy.bad(file, at, f"id {columns.id!r} is null")
                else:
                    chunk.texts.append(text)
                    chunk.ids.append(ids[k] if ids is not None else file.row_id(at))
                    chunk.rows.append(at)
            yield chunk
        row += batch.num_rows
        if row >= stop:
            return


def _read_lines(
    file: InputFile, start: int, stop: int, byte_start: int, columns: Columns, policy: RecordPolicy
) -> Iterator[Rows]:
    chunk = Rows()
    with open(file.path, "rb") as handle:
        handle.seek(byte_start)
        for at in range(start, stop):
            raw = handle.readline()
            if not raw:
                raise CorpusError(f"{file.path} changed while being read: it ended before line {at + 1}; restart the run")
            record = _parse_line(file, at, raw, columns, policy)
            chunk.span += 1
            if record is not None:
                chunk.ids.append(record[0])
                chunk.texts.append(record[1])
                chunk.rows.append(at)
            if chunk.span >= CHUNK_ROWS:
                yield chunk
                chunk = Rows()
    if chunk.span:
        yield chunk


def _parse_line(file: InputFile, at: int, raw: bytes, columns: Columns, policy: RecordPolicy) -> tuple[Any, str] | None:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        policy.bad(file, at, f"not valid UTF-8 (byte {err.start} of the line)")
        return None
    line = line[:-1] if line.endswith("\n") else line
    line = line[:-1] if line.endswith("\r") else line
    if file.format == "txt":
        return file.row_id(at), line
    if not line.strip():
        return None  # blank lines of a JSONL file hold no record
    try:
        item = json.loads(line)
    except json.JSONDecodeError as err:
        policy.bad(file, at, f"not valid JSON ({err.msg} at column {err.colno})")
        return None
    except RecursionError:
        policy.bad(file, at, "arrays or objects nested too deeply to parse")
        return None
    if isinstance(item, str) and columns.id is None:
        return _unicode_checked(file, at, file.row_id(at), item, policy)
    if not isinstance(item, dict):
        policy.bad(file, at, f"expected a JSON object with a {columns.text!r} string, got {type(item).__name__}")
        return None
    if columns.text not in item:
        policy.bad(file, at, f"the object has no {columns.text!r} key (pass --text-column)")
        return None
    text = item[columns.text]
    if not isinstance(text, str):
        policy.bad(file, at, f"{columns.text!r} is {_json_type(text)}, expected a string")
        return None
    if columns.id is None:
        return _unicode_checked(file, at, file.row_id(at), text, policy)
    ident = item.get(columns.id)
    if isinstance(ident, bool) or not isinstance(ident, (str, int)):
        policy.bad(file, at, f"id {columns.id!r} is {_json_type(ident) if columns.id in item else 'missing'}, expected a string or an integer")
        return None
    if isinstance(ident, str) and unicode_problem(ident) is not None:
        policy.bad(file, at, f"id {columns.id!r} {unicode_problem(ident)}")
        return None
    return _unicode_checked(file, at, str(ident), text, policy)


def _unicode_checked(file: InputFile, at: int, ident: Any, text: str, policy: RecordPolicy) -> tuple[Any, str] | None:
    """The record, or None (counted under ``--on-error``) when its text is not Unicode text: JSON's
    ``"\\ud800"`` escape decodes to a lone surrogate, which no tokenizer or Parquet file takes."""
    problem = unicode_problem(text)
    if problem is not None:
        policy.bad(file, at, f"the text {problem}")
        return None
    return ident, text


def _json_type(value: Any) -> str:
    return {type(None): "null", bool: "a boolean", int: "a number", float: "a number", list: "an array", dict: "an object"}.get(
        type(value), type(value).__name__
    )
