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
import warnings
from pathlib import Path
from typing import Iterable, Iterator

try:  # POSIX: a live writer's work directory is told apart from a killed one's by a lock
    import fcntl
except ImportError:  # pragma: no cover - Windows: nothing is reported as left over
    fcntl = None  # type: ignore[assignment]

#: beside each hidden work directory, a file of its name plus this, locked while its writer lives
LOCK_SUFFIX = ".lock"


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


class LeftoverWarning(UserWarning):
    """Hidden work directories a writer killed before it could clean up (SIGKILL, the out-of-memory
    killer, a power cut) left beside an output: unseen (their names start with a dot), as big as
    what they held."""


@contextlib.contextmanager
def claimed_workdir(parent: Path, prefix: str) -> Iterator[Path]:
    """A new hidden directory ``parent/prefix<random>`` for the block, removed after it, with its
    lock file beside it held for as long: :func:`leftovers` then tells a killed writer's directory
    (a lock nobody holds) from a live writer's. The lock is taken under a temporary name and
    renamed into place, and the directory made after, so no scan sees a live one unlocked."""
    parent.mkdir(parents=True, exist_ok=True)
    directory = parent / f"{prefix}{uuid.uuid4().hex[:8]}"
    lock = directory.with_name(directory.name + LOCK_SUFFIX)
    handle = None
    if fcntl is not None:
        taking = lock.with_name(lock.name + ".new")
        handle = os.open(taking, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(handle, fcntl.LOCK_EX)
        os.replace(taking, lock)
    try:
        directory.mkdir()
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        if handle is not None:
            lock.unlink(missing_ok=True)
            os.close(handle)


def abandoned(directory: Path) -> bool:
    """Whether the hidden work directory ``directory`` (:func:`claimed_workdir`) outlived its
    writer: its lock file is there and no process holds it. False without a lock file (a writer of
    another version, or one starting) and where locks do not exist."""
    if fcntl is None:
        return False
    try:
        handle = os.open(directory.with_name(directory.name + LOCK_SUFFIX), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(handle)  # releases the lock if it was taken
    return directory.is_dir()


def leftovers(out: Path, prefixes: Iterable[str] = ()) -> list[Path]:
    """The abandoned (:func:`abandoned`) staging directories of ``out`` (:func:`staged`) and work
    directories named by ``prefixes`` beside it."""
    return sorted({p for prefix in (f".{out.name}.partial-", *prefixes) for p in out.parent.glob(f"{prefix}*") if abandoned(p)})


def warn_leftovers(out: Path, prefixes: Iterable[str] = ()) -> list[Path]:
    """One :class:`LeftoverWarning` naming :func:`leftovers` and their size, so a disk filled by
    killed runs is seen. Nothing is deleted: a lock held on another host over a network file
    system may not show here."""
    found = leftovers(out, prefixes)
    if found:
        size = sum(f.stat().st_size for d in found for f in d.rglob("*") if f.is_file())
        shown = f"{size / 1e9:.1f} GB" if size >= 1e9 else f"{size / 1e6:.1f} MB"
        warnings.warn(
            f"{shown} beside {str(out)!r} left by a run killed before it could clean up (no process holds "
            f"its lock): {', '.join(str(p) for p in found)}; delete them and their {LOCK_SUFFIX} files",
            LeftoverWarning, stacklevel=2)
    return found


@contextlib.contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A hidden directory beside ``out`` to write into (:func:`claimed_workdir`): renamed to
    ``out`` (replacing what is there; the caller checked ``force``) when the block ends without an
    error, removed otherwise, so a failed or interrupted run never leaves a directory that looks
    finished."""
    with claimed_workdir(out.parent, f".{out.name}.partial-") as staging:
        yield staging
        _commit(staging, out)


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
