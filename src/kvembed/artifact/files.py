"""The artifact's file records: the sha256 and size of every file, written by the exporter and
checked by every loader through :func:`check_intact`, so files of two exports never mix and a
damaged file is named."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..errors import InvalidInput
from .layout import ENGINE_JSON, MANIFEST, MODEL, PLAN, TOKENIZER
from .manifest import FileRecord, Manifest, load_manifest, manifest_of


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while True:
            block = handle.read(chunk)
            if not block:
                break
            digest.update(block)
    return digest.hexdigest()


def record_of(path: Path) -> FileRecord:
    return FileRecord(sha256_file(path), path.stat().st_size)


def file_records(directory: Path) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file in ``directory`` except the manifest itself (the JSON form)."""
    return {
        path.name: record_of(path).to_dict()
        for path in sorted(directory.iterdir())
        if path.is_file() and path.name != MANIFEST
    }


def check_records(directory: str | os.PathLike[str], files: Mapping[str, FileRecord]) -> list[str]:
    """Problems with ``files`` in ``directory`` (missing, not a regular file, a link out of the
    folder, wrong size or hash); empty when all is well. The size is compared first: it costs nothing
    and catches a truncated copy without hashing. Only files inside the folder are ever measured, so
    no message tells anything about a file elsewhere."""
    directory = Path(directory)
    problems = []
    for name, record in files.items():
        path, problem = _inside(directory, name)
        if problem is not None:
            problems.append(problem)
            continue
        size = path.stat().st_size
        if size != record.size:
            problems.append(f"{name} has {size} bytes, manifest says {record.size}")
        elif sha256_file(path) != record.sha256:
            problems.append(f"{name} does not match its sha256 in the manifest")
    return problems


def _inside(directory: Path, name: str) -> tuple[Path, str | None]:
    """``directory / name`` and None when it is a regular file inside the folder (a link is
    followed only when it stays inside), else the problem in words."""
    path = directory / name
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return path, f"{name} is missing"
    except OSError as err:
        return path, f"{name} cannot be read ({err.strerror})"
    if stat.S_ISLNK(mode):
        if not _within(path.resolve(), directory.resolve()):
            return path, f"{name} is a link out of the artifact folder"
        try:
            mode = path.stat().st_mode
        except OSError:
            return path, f"{name} is a broken link"
    if not stat.S_ISREG(mode):
        return path, f"{name} is not a regular file"
    return path, None


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def folder_problems(directory: str | os.PathLike[str]) -> list[str]:
    """Entries that would let a reader leave the artifact folder, wherever they are in it: links
    that resolve outside, and devices, pipes and sockets (a graph's external data may name any file
    of the folder, so listed or not, none may point away)."""
    root = Path(directory).resolve()
    problems = []
    for folder, subfolders, names in os.walk(root):
        for name in [*subfolders, *names]:
            path = Path(folder) / name
            relative = path.relative_to(root).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                if not _within(path.resolve(), root):
                    problems.append(f"{relative} is a link out of the artifact folder")
            elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                problems.append(f"{relative} is not a regular file")
    return problems


def check_files(directory: str | os.PathLike[str], manifest: Manifest | None = None) -> list[str]:
    """Problems with the artifact's files against its manifest (read from ``directory`` when not
    given), and anything in the folder that leads out of it (:func:`folder_problems`); empty when
    all is well."""
    manifest = load_manifest(directory) if manifest is None else manifest
    return _and_folder(directory, check_records(directory, manifest.files))


def closed_problems(directory: str | os.PathLike[str], names: Iterable[str]) -> list[str]:
    """Without hashing: each of ``names`` a regular file inside the folder, and nothing in the
    folder leading out of it (:func:`folder_problems`). For a reader that hashes what it copies
    itself (``kvembed bundle``)."""
    root = Path(directory)
    return _and_folder(root, [problem for name in names if (problem := _inside(root, name)[1]) is not None])


def _and_folder(directory: str | os.PathLike[str], problems: list[str]) -> list[str]:
    """``problems`` and the folder's own (:func:`folder_problems`), each once."""
    return problems + [p for p in folder_problems(directory) if p not in problems]


class DamagedArtifact(InvalidInput):
    """An artifact's (or engine directory's) files do not match its manifest: the message names
    each problem and the fix."""


def engine_problems(directory: str | os.PathLike[str], manifest: Manifest, record: Mapping[str, Any]) -> list[str]:
    """Problems with an engine directory's files; empty when all is well: the artifact files it
    carries (tokenizer, ...) against the manifest, the plan against ``engine.json``'s
    ``plan_sha256`` (``record``), and the two naming the same source graph."""
    directory = Path(directory)
    files = manifest.files
    problems = check_records(directory, {name: entry for name, entry in files.items() if not name.startswith(MODEL)})
    graph = files[MODEL].sha256 if MODEL in files else None
    built_from = (record.get("source") or {}).get("model_sha256")
    if graph and built_from and graph != built_from:
        problems.append(f"{ENGINE_JSON}'s plan was built from a {MODEL} with sha256 {built_from[:12]}..., {MANIFEST} "
                        f"describes one with {graph[:12]}... (files of two exports mixed)")
    plan, problem = _inside(directory, PLAN)
    if problem is not None:
        problems.append(problem)
    elif record.get("plan_sha256") and sha256_file(plan) != record["plan_sha256"]:
        problems.append(f"{PLAN} does not match its sha256 in {ENGINE_JSON}")
    return problems


def check_intact(source: Manifest | str | os.PathLike[str], engine: Mapping[str, Any] | None = None) -> Manifest:
    """The artifact's manifest once every file it lists is present with its size and sha256 (the
    one integrity check of every loader); :class:`DamagedArtifact` names each problem and the fix.

    ``source``: the artifact directory, or its manifest as :func:`~.manifest.load_manifest` read it
    (not read again). ``engine``: an engine directory's ``engine.json`` record (read and checked by
    the TensorRT backend), whose plan is checked instead of the graph it was built from."""
    manifest = manifest_of(source)
    directory = manifest.artifact_directory()
    if engine is None:
        problems, what, fix = check_records(directory, manifest.files), "artifact", "re-export it"
    else:
        problems, what, fix = engine_problems(directory, manifest, engine), "engine directory", "rebuild it with kvembed build-engine"
    problems = _and_folder(directory, problems)
    unlisted = [name for name in (TOKENIZER, *(manifest.graph_file(b) for b in manifest.graphs)) if name not in manifest.files]
    if engine is None and MODEL not in manifest.files:
        unlisted.insert(0, MODEL)
    if manifest.context_encoder is not None and manifest.context_encoder.tokenizer not in manifest.files:
        unlisted.append(manifest.context_encoder.tokenizer)
    problems += [f"{name} is read but not listed in the manifest's files" for name in dict.fromkeys(unlisted)]
    if problems:
        raise DamagedArtifact(f"{what} {str(directory)!r} is damaged: {'; '.join(problems)}; {fix}")
    return manifest
