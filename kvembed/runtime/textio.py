"""Reading texts from and writing embeddings to files (.txt, .jsonl, .npy), streaming."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

INPUT_SUFFIXES = (".txt", ".jsonl")
OUTPUT_SUFFIXES = (".npy", ".jsonl")


def read_texts(path: Path) -> Iterator[str]:
    """Texts from ``path``: one per line (.txt), or one JSON string / object with ``"text"`` per line (.jsonl)."""
    if path.suffix not in INPUT_SUFFIXES:
        raise ValueError(f"--input must be a .txt or .jsonl file, got {path}")
    if not path.is_file():
        raise FileNotFoundError(f"no input file at {str(path)!r}")
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            line = line.rstrip("\n").rstrip("\r")
            if path.suffix == ".txt":
                yield line
                continue
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number} is not valid JSON ({err.msg})") from None
            text = item.get("text") if isinstance(item, dict) else item
            if not isinstance(text, str):
                raise ValueError(f'{path}:{number}: expected a JSON string or an object with a "text" string')
            yield text


def count_lines(path: Path) -> int:
    with open(path, "rb") as handle:
        return sum(1 for _ in handle)


def check_output_path(path: Path) -> None:
    if path.suffix not in OUTPUT_SUFFIXES:
        raise ValueError(f"--output must end in .npy or .jsonl, got {path}")


def write_embeddings(path: Path, chunks: Iterable[np.ndarray]) -> tuple[int, int]:
    """Write streamed chunks to ``path`` (.npy: one (n, dim) array; .jsonl: one row per line).

    Writes to a temporary file renamed at the end, so an interrupted run leaves no partial output.
    Returns ``(rows, dim)``.
    """
    check_output_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    rows, dim = 0, 0
    try:
        if path.suffix == ".jsonl":
            with open(partial, "w", encoding="utf-8") as handle:
                for chunk in chunks:
                    for vector in chunk:
                        handle.write(json.dumps({"index": rows, "embedding": [round(float(x), 7) for x in vector]}) + "\n")
                        rows += 1
                    dim = chunk.shape[1]
        else:
            parts = [chunk for chunk in chunks]
            array = np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)
            with open(partial, "wb") as handle:
                np.save(handle, array)
            rows, dim = array.shape[0], array.shape[1] if array.ndim == 2 else 0
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return rows, dim
