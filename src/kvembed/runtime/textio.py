"""Reading texts from and writing embeddings to files (.txt, .jsonl, .npy), streaming.

Input: ``.txt`` (one text per line), ``.jsonl`` (a JSON string, or an object with ``"text"`` and
an optional ``"id"``, per line), or ``-`` for standard input (one text per line). Output:
``.npy`` (one ``(n, dim)`` float32 array; int8 or uint8 rows of a quantized vector type) or
``.jsonl`` (``{"index", "id"?, "embedding"}`` per line, integers for a quantized type; ``id`` is
carried through from a JSONL input that has one).
"""

from __future__ import annotations

import json
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

import numpy as np

from ..errors import InvalidInput
from .encoding import unicode_problem

INPUT_SUFFIXES = (".txt", ".jsonl")
OUTPUT_SUFFIXES = (".npy", ".jsonl")
STDIN = "-"


def is_stdin(path: Path | str) -> bool:
    return str(path) == STDIN


def check_input_path(path: Path) -> None:
    """Fail before any work starts when ``path`` cannot be read as an input."""
    if is_stdin(path):
        return
    if path.suffix not in INPUT_SUFFIXES:
        raise InvalidInput(f"--input must be a .txt or .jsonl file (or - for standard input), got {path}")
    if path.is_dir():
        raise IsADirectoryError(f"--input {str(path)!r} is a directory; give a .txt or .jsonl file")
    if not path.is_file():
        raise FileNotFoundError(f"no input file at {str(path)!r}")
    with open(path, "rb") as handle:
        if not any(line.strip() for line in handle):  # stops at the first text
            raise no_texts(str(path), empty=path.stat().st_size == 0)


def no_texts(name: str, empty: bool) -> InvalidInput:
    """The error of an input holding no text to embed (an empty file, or blank lines only)."""
    what = "is empty" if empty else "holds only blank lines"
    return InvalidInput(f"--input {name} {what}: no texts to embed (one text per line, or JSON Lines)")


@dataclass
class TextRecords:
    """Texts read lazily from ``path``; the ``id`` of each JSONL object read so far waits in ``ids``
    until the writer takes it (so ids stay aligned with streamed embeddings)."""

    path: Path
    track_ids: bool = True
    ids: deque = field(default_factory=deque)

    def __iter__(self) -> Iterator[str]:
        check_input_path(self.path)
        name = "<stdin>" if is_stdin(self.path) else str(self.path)
        jsonl = not is_stdin(self.path) and self.path.suffix == ".jsonl"
        handle: IO[bytes] = sys.stdin.buffer if is_stdin(self.path) else open(self.path, "rb")
        read = texts = 0  # lines read, lines holding text: an input without text is refused at its end
        try:
            for number, raw in enumerate(handle, start=1):
                read, texts = number, texts + bool(raw.strip())
                try:
                    line = raw.decode("utf-8").rstrip("\n").rstrip("\r")
                except UnicodeDecodeError as err:
                    raise InvalidInput(
                        f"{name}:{number} is not valid UTF-8 (byte {err.start}: {raw[err.start:err.start + 1]!r}); "
                        "re-encode the file as UTF-8"
                    ) from None
                if not jsonl:
                    if self.track_ids:
                        self.ids.append(None)
                    yield line
                    continue
                if not line.strip():
                    continue
                text, ident = _parse_jsonl(line, name, number)
                if self.track_ids:
                    self.ids.append(ident)
                yield text
            if not texts:
                raise no_texts("- (standard input)" if is_stdin(self.path) else name, empty=read == 0)
        finally:
            if handle is not sys.stdin.buffer:
                handle.close()


def _parse_jsonl(line: str, name: str, number: int) -> tuple[str, Any]:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as err:
        raise InvalidInput(f"{name}:{number} is not valid JSON ({err.msg})") from None
    except RecursionError:
        raise InvalidInput(f"{name}:{number} nests arrays or objects too deeply to parse") from None
    text = item.get("text") if isinstance(item, dict) else item
    if not isinstance(text, str):
        raise InvalidInput(f'{name}:{number}: expected a JSON string or an object with a "text" string')
    problem = unicode_problem(text)
    if problem is not None:
        raise InvalidInput(f"{name}:{number}: the text {problem}")
    ident = item.get("id") if isinstance(item, dict) else None
    return text, ident


def count_lines(path: Path) -> int | None:
    """Lines in ``path`` (for a progress total); None for standard input."""
    if is_stdin(path):
        return None
    with open(path, "rb") as handle:
        return sum(1 for _ in handle)


def check_output_path(path: Path) -> None:
    if path.suffix not in OUTPUT_SUFFIXES:
        raise InvalidInput(f"--output must end in .npy or .jsonl, got {path}")
    if path.is_dir():
        raise IsADirectoryError(f"--output {str(path)!r} is a directory; give a .npy or .jsonl file name")


def write_embeddings(
    path: Path, chunks: Iterable[np.ndarray], dim: int, ids: TextRecords | None = None
) -> tuple[int, int]:
    """Write streamed chunks to ``path`` (.npy: one (n, dim) array; .jsonl: one row per line).

    ``dim`` is the embedding width (an empty input still gives an ``(0, dim)`` array). With
    ``ids`` (the :class:`TextRecords` the chunks were computed from), JSONL rows carry each
    input's ``id``. Writes to a temporary file renamed at the end, so an interrupted run leaves
    no partial output. Returns ``(rows, dim)``.
    """
    check_output_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    rows = 0
    try:
        if path.suffix == ".jsonl":
            with open(partial, "w", encoding="utf-8") as handle:
                for chunk in chunks:
                    for vector in chunk:
                        row: dict[str, Any] = {"index": rows}
                        ident = ids.ids.popleft() if ids is not None and ids.ids else None
                        if ident is not None:
                            row["id"] = ident
                        row["embedding"] = vector.tolist() if vector.dtype.kind in "iu" else [round(float(x), 7) for x in vector]
                        handle.write(json.dumps(row, ensure_ascii=False) + "\n")
                        rows += 1
        else:
            parts = [chunk for chunk in chunks]
            array = np.concatenate(parts) if parts else np.zeros((0, dim), np.float32)
            with open(partial, "wb") as handle:
                np.save(handle, array)
            rows = array.shape[0]
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return rows, dim
