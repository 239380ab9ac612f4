"""Write a directory so that it appears whole or not at all: the one staged writer every
command that writes a directory uses (artifacts, TensorRT engines, bundles, Triton repositories),
and :func:`write_text_atomic` / :func:`write_bytes_atomic` for a single file.

Dependency-free, so torch-free commands (``kvembed bundle``) can use it as the exporter does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator


class OutputExistsError(FileExistsError):
    """``out`` exists and is not an empty directory (and ``force`` was not given)."""


class OutputIsAFileError(OutputExistsError, NotADirectoryError):
    """``out`` is a file: refused even with ``force`` (a directory never replaces a file)."""


def check_output(out: str | os.PathLike[str], force: bool = False) -> Path:
    """Refuse an ``out`` that is a file (even with ``force``), or a non-empty directory unless
    ``force``; writes nothing."""
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise OutputIsAFileError(f"output {str(path)!r} is a file, not a directory; give a directory path")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise OutputExistsError(f"output directory {str(path)!r} is not empty; use --force to replace it")
    return path


@contextlib.contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A hidden directory beside ``out`` to write into: renamed to ``out`` (replacing what is
    there; the caller checked ``force``) when the block ends without an error, removed otherwise,
    so a failed or interrupted run never leaves a directory that looks finished."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.partial-{uuid.uuid4().hex[:8]}")
    staging.mkdir()
    try:
        yield staging
        _commit(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already after the commit


def _commit(staging: Path, out: Path) -> None:
    """Move ``staging`` to ``out``, replacing what is there (the caller checked ``force``)."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(out, old)
    try:
        os.replace(staging, out)
    except BaseException:
        if old is not None:
            os.replace(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically, as :func:`write_bytes_atomic` does."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes | bytearray | memoryview) -> Path:
    """Write ``data`` to ``path`` through a file beside it renamed into place, so a reader never
    sees half a file and a failed write leaves the earlier file, if any, as it was."""
    partial = path.with_name(f"{path.name}.partial-{uuid.uuid4().hex[:8]}")
    try:
        partial.write_bytes(data)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path
