"""Local evaluation tasks: read and validate TSV/JSONL task files, torch-free and mteb-free.

A task is one of (the kind follows from the columns, or from the folder layout):

- **STS** — one file with ``sentence1``, ``sentence2``, ``score`` (any numeric scale: only the
  ranking and the linear correlation of the scores matter);
- **classification** — one file with ``text``, ``label`` and ``split`` (``train`` or ``test``);
- **retrieval** — a folder with ``queries`` (``id``, ``text``), ``corpus`` (``id``, ``text``,
  optional ``title``) and ``qrels`` (``query-id``, ``corpus-id``, ``score``: graded relevance,
  > 0 is relevant), each ``.tsv`` or ``.jsonl`` (BEIR's column names).

``.tsv`` files have a header row and tab-separated fields (no quoting: a field cannot hold a tab
or a newline); ``.jsonl`` files hold one JSON object per line. Everything is checked here, before
any model or mteb loads, so a bad file fails in a second with a message naming file, line and fix.
The bundled sample tasks (``sample-sts``, ``sample-retrieval``, ``sample-classification``, or
``sample`` for all three) live in ``kvembed/data/tasks``.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ..errors import KvembedError

SAMPLE_DIR = Path(__file__).resolve().parents[1] / "data" / "tasks"
SAMPLES = {
    "sample-sts": SAMPLE_DIR / "sample-sts.tsv",
    "sample-retrieval": SAMPLE_DIR / "sample-retrieval",
    "sample-classification": SAMPLE_DIR / "sample-classification.jsonl",
}
SUFFIXES = (".tsv", ".jsonl")
STS_COLUMNS = ("sentence1", "sentence2", "score")
CLASSIFICATION_COLUMNS = ("text", "label", "split")
RETRIEVAL_PARTS = {
    "queries": ("id", "text"),
    "corpus": ("id", "text"),
    "qrels": ("query-id", "corpus-id", "score"),
}
FORMATS_HINT = (
    "a task is a .tsv/.jsonl file with sentence1, sentence2, score (STS) or text, label, split "
    "(classification), or a folder holding queries, corpus and qrels files (retrieval); see "
    "'kvembed eval --help' and the README"
)


class TaskFileError(KvembedError, ValueError):
    """A task file that cannot be used as given (exit 2, one line)."""


@dataclass(frozen=True)
class LocalTask:
    """A validated local task. ``data`` holds plain Python lists/dicts (see the ``kind``'s loader)."""

    name: str
    kind: str  # "sts" | "retrieval" | "classification"
    path: Path
    data: dict[str, Any] = field(repr=False)

    @property
    def size(self) -> str:
        """A short description of the task's size, for tables and logs."""
        if self.kind == "sts":
            return f"{len(self.data['score'])} pairs"
        if self.kind == "retrieval":
            return f"{len(self.data['queries'])} queries, {len(self.data['corpus'])} passages"
        splits = self.data["split"]
        return f"{splits.count('train')} train / {splits.count('test')} test texts, {len(set(self.data['label']))} labels"


def resolve_task_paths(values: list[str]) -> list[Path]:
    """Expand ``sample`` / ``sample-*`` names to the bundled files; other values are paths."""
    paths: list[Path] = []
    for value in values:
        if value == "sample":
            paths.extend(SAMPLES.values())
        elif value in SAMPLES:
            paths.append(SAMPLES[value])
        else:
            paths.append(Path(value).expanduser())
    return paths


def load_task(path: Path) -> LocalTask:
    """Read and validate one task file or folder."""
    if not path.exists():
        raise TaskFileError(f"task {str(path)!r} does not exist; {FORMATS_HINT} (or use --task sample)")
    if path.is_dir():
        return _load_retrieval(path)
    if path.suffix.lower() not in SUFFIXES:
        raise TaskFileError(f"task file {str(path)!r}: unknown format {path.suffix or '(no suffix)'!r}; use .tsv or .jsonl ({FORMATS_HINT})")
    columns, rows = read_table(path)
    present = set(columns)
    if present & set(STS_COLUMNS):
        return _load_sts(path, columns, rows)
    if present & {"text", "label"}:
        return _load_classification(path, columns, rows)
    raise TaskFileError(f"task file {str(path)!r} has columns {', '.join(columns)}: neither STS "
                        f"({', '.join(STS_COLUMNS)}) nor classification ({', '.join(CLASSIFICATION_COLUMNS)})")


def load_tasks(values: list[str]) -> list[LocalTask]:
    """Every ``--task`` value, validated; task names must be unique (they name mteb's result files)."""
    tasks = [load_task(path) for path in resolve_task_paths(values)]
    seen: dict[str, Path] = {}
    for task in tasks:
        if task.name in seen:
            raise TaskFileError(f"two tasks are named {task.name!r} ({seen[task.name]} and {task.path}); "
                                f"task names come from the file or folder name: rename one")
        seen[task.name] = task.path
    return tasks


def read_table(path: Path) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    """(columns, [(line number, row)]) of a .tsv or .jsonl file; empty files are refused."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise TaskFileError(f"task file {str(path)!r} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    if not text.strip():
        raise TaskFileError(f"task file {str(path)!r} is empty")
    if path.suffix.lower() == ".jsonl":
        return _read_jsonl(path, text)
    return _read_tsv(path, text)


def _read_tsv(path: Path, text: str) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    lines = text.splitlines()
    reader = csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)
    header = [name.strip() for name in next(reader)]
    if len(set(header)) != len(header) or not all(header):
        raise TaskFileError(f"{path}:1: the header row needs distinct, non-empty column names, got {header}")
    rows: list[tuple[int, dict[str, Any]]] = []
    for number, fields in enumerate(reader, start=2):
        if not fields or (len(fields) == 1 and not fields[0].strip()):
            continue  # blank line
        if len(fields) != len(header):
            raise TaskFileError(f"{path}:{number}: {len(fields)} tab-separated fields, the header has {len(header)} "
                                f"({', '.join(header)})")
        rows.append((number, dict(zip(header, fields))))
    if not rows:
        raise TaskFileError(f"task file {str(path)!r} has a header but no rows")
    return header, rows


def _read_jsonl(path: Path, text: str) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    rows: list[tuple[int, dict[str, Any]]] = []
    columns: dict[str, None] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise TaskFileError(f"{path}:{number}: invalid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise TaskFileError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        columns.update(dict.fromkeys(row))
        rows.append((number, row))
    return list(columns), rows


def _require(path: Path, columns: list[str], needed: tuple[str, ...], kind: str) -> None:
    missing = [name for name in needed if name not in columns]
    if missing:
        raise TaskFileError(f"task file {str(path)!r}: missing column {', '.join(repr(m) for m in missing)} "
                            f"(has {', '.join(columns)}); {kind} needs {', '.join(needed)}")


def _text(path: Path, number: int, row: dict[str, Any], column: str) -> str:
    value = row.get(column)
    if not isinstance(value, str):
        got = "missing" if value is None else f"a {type(value).__name__}"
        raise TaskFileError(f"{path}:{number}: column {column!r} must be a string, got {got}")
    return value


def _number(path: Path, number: int, row: dict[str, Any], column: str) -> float:
    value = row.get(column)
    try:
        result = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TaskFileError(f"{path}:{number}: column {column!r} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(result):
        raise TaskFileError(f"{path}:{number}: column {column!r} must be a finite number, got {value!r}")
    return result


def _load_sts(path: Path, columns: list[str], rows: list[tuple[int, dict[str, Any]]]) -> LocalTask:
    _require(path, columns, STS_COLUMNS, "an STS task")
    data: dict[str, list[Any]] = {name: [] for name in STS_COLUMNS}
    for number, row in rows:
        data["sentence1"].append(_text(path, number, row, "sentence1"))
        data["sentence2"].append(_text(path, number, row, "sentence2"))
        data["score"].append(_number(path, number, row, "score"))
    if len(rows) < 3 or len(set(data["score"])) < 2:
        raise TaskFileError(f"task file {str(path)!r}: an STS task needs at least 3 pairs and 2 distinct scores "
                            f"(a correlation is undefined otherwise)")
    return LocalTask(path.stem, "sts", path, data)


def _load_classification(path: Path, columns: list[str], rows: list[tuple[int, dict[str, Any]]]) -> LocalTask:
    _require(path, columns, CLASSIFICATION_COLUMNS, "a classification task")
    data: dict[str, list[Any]] = {name: [] for name in CLASSIFICATION_COLUMNS}
    for number, row in rows:
        data["text"].append(_text(path, number, row, "text"))
        label = row.get("label")
        if isinstance(label, bool) or not isinstance(label, (str, int)) or label == "":
            raise TaskFileError(f"{path}:{number}: column 'label' must be a non-empty string or an integer, got {label!r}")
        data["label"].append(str(label))
        split = _text(path, number, row, "split").strip().lower()
        if split not in ("train", "test"):
            raise TaskFileError(f"{path}:{number}: column 'split' must be train or test, got {split!r}")
        data["split"].append(split)
    train = {label for label, split in zip(data["label"], data["split"]) if split == "train"}
    test = {label for label, split in zip(data["label"], data["split"]) if split == "test"}
    if len(train) < 2 or not test:
        raise TaskFileError(f"task file {str(path)!r}: a classification task needs train rows of at least 2 labels "
                            f"and some test rows (has {len(train)} train labels, {len(test)} test labels)")
    if test - train:
        raise TaskFileError(f"task file {str(path)!r}: test labels {sorted(test - train)} never occur in train rows")
    return LocalTask(path.stem, "classification", path, data)


def _part(folder: Path, part: str) -> Path:
    found = [folder / f"{part}{suffix}" for suffix in SUFFIXES if (folder / f"{part}{suffix}").is_file()]
    if len(found) != 1:
        what = "no" if not found else "two"
        raise TaskFileError(f"retrieval task folder {str(folder)!r} has {what} {part}.tsv/{part}.jsonl; a retrieval "
                            f"task folder holds exactly one each of queries, corpus and qrels (.tsv or .jsonl)")
    return found[0]


def _records(path: Path, needed: tuple[str, ...], kind: str) -> Iterator[tuple[int, dict[str, Any]]]:
    columns, rows = read_table(path)
    _require(path, columns, needed, kind)
    return iter(rows)


def _load_retrieval(folder: Path) -> LocalTask:
    texts: dict[str, dict[str, Any]] = {}
    for part in ("queries", "corpus"):
        path = _part(folder, part)
        entries: dict[str, Any] = {}
        for number, row in _records(path, RETRIEVAL_PARTS[part], f"retrieval {part}"):
            key = str(row.get("id", "")).strip()
            if not key:
                raise TaskFileError(f"{path}:{number}: empty id")
            if key in entries:
                raise TaskFileError(f"{path}:{number}: id {key!r} occurs twice")
            text = _text(path, number, row, "text")
            if part == "corpus":
                title = row.get("title") or ""
                if not isinstance(title, str):
                    raise TaskFileError(f"{path}:{number}: column 'title' must be a string")
                entries[key] = {"text": text, "title": title}
            else:
                entries[key] = text
        texts[part] = entries
    qrels_path = _part(folder, "qrels")
    qrels: dict[str, dict[str, int]] = {}
    for number, row in _records(qrels_path, RETRIEVAL_PARTS["qrels"], "retrieval qrels"):
        query, doc = str(row["query-id"]).strip(), str(row["corpus-id"]).strip()
        if query not in texts["queries"]:
            raise TaskFileError(f"{qrels_path}:{number}: query-id {query!r} is not in the queries file")
        if doc not in texts["corpus"]:
            raise TaskFileError(f"{qrels_path}:{number}: corpus-id {doc!r} is not in the corpus file")
        score = _number(qrels_path, number, row, "score")
        if score != int(score):
            raise TaskFileError(f"{qrels_path}:{number}: score must be an integer relevance grade, got {row['score']!r}")
        qrels.setdefault(query, {})[doc] = int(score)
    if not any(score > 0 for docs in qrels.values() for score in docs.values()):
        raise TaskFileError(f"retrieval task {str(folder)!r}: no qrels row has a score > 0, so nothing is relevant")
    return LocalTask(folder.name, "retrieval", folder, {"queries": texts["queries"], "corpus": texts["corpus"], "qrels": qrels})
