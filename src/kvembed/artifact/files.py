"""The artifact's file records: the sha256 and size of every file, written by the exporter and
checked by every loader, so files of two exports never mix and a damaged file is named."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Mapping

from .layout import MANIFEST
from .manifest import FileRecord, Manifest, load_manifest


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
    """Problems with ``files`` in ``directory`` (missing, wrong size or hash); empty when all is well.
    The size is compared first: it costs nothing and catches a truncated copy without hashing."""
    directory = Path(directory)
    problems = []
    for name, record in files.items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{name} is missing")
            continue
        size = path.stat().st_size
        if size != record.size:
            problems.append(f"{name} has {size} bytes, manifest says {record.size}")
        elif sha256_file(path) != record.sha256:
            problems.append(f"{name} does not match its sha256 in the manifest")
    return problems


def check_files(directory: str | os.PathLike[str], manifest: Manifest | Mapping[str, Any] | None = None) -> list[str]:
    """Problems with the artifact's files against its manifest (read from ``directory`` when not
    given); empty when all is well."""
    manifest = load_manifest(directory) if manifest is None else Manifest.of(manifest)
    return check_records(directory, manifest.files)
