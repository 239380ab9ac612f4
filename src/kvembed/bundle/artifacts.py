"""Artifacts into the bundle: each file its manifest lists (plus the manifest, and a signed
artifact's ``kvembed.sig``), hard-linked when source and bundle share a filesystem (a large graph
costs no copy), else copied, and every copy re-hashed against the artifact's own manifest, so a
bundle never carries a file that differs from what the exporter certified."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

from ..artifact import MANIFEST, SIGNATURE, DamagedArtifact, Manifest, closed_problems, load_manifest, sha256_file
from ..artifact.engine import is_engine_dir
from ..artifact.layout import named_directory
from ..errors import InvalidInput



def parse_artifact_argument(value: str) -> tuple[str, Path, Manifest]:
    """``DIR`` (named after its folder, as ``kvembed serve`` names it) or ``NAME=DIR``, with its
    manifest (read here, once: one line if it is not an artifact)."""
    name, directory = named_directory(value)
    if is_engine_dir(directory):
        raise InvalidInput(f"{value!r} is a TensorRT engine directory (GPU-bound): bundle the ONNX artifact it was built from")
    return name, directory, load_manifest(directory)


def link_or_copy(source: Path, dest: Path) -> str:
    """Hard-link ``source`` at ``dest`` if the filesystem allows it, else copy; says which."""
    try:
        os.link(source.resolve(), dest)  # a link inside the artifact: its file, not the link itself
        return "linked"
    except OSError as err:
        if err.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES):
            raise
    shutil.copy2(source, dest)
    return "copied"


def add_artifact(source: Path, dest: Path, manifest: Manifest) -> dict[str, Any]:
    """Put the artifact ``source`` (whose ``manifest`` the caller read) at ``dest``; returns its
    bundle.json record (method, precision, files with sha256). A file that does not match its
    manifest hash is refused (one line, naming it)."""
    for name in manifest.files:
        if Path(name).name != name:
            raise InvalidInput(f"{source / MANIFEST} lists {name!r}: not a plain file name")
    problems = closed_problems(source, [*manifest.files, MANIFEST])  # before anything is linked or copied
    if problems:
        raise DamagedArtifact(f"artifact {str(source)!r} is damaged: {'; '.join(problems)}; re-export it")
    dest.mkdir(parents=True)
    how = set()
    files: dict[str, dict[str, Any]] = {}
    for name, record in manifest.files.items():
        origin = source / name
        how.add(link_or_copy(origin, dest / name))
        digest = sha256_file(dest / name)
        if digest != record.sha256 or (dest / name).stat().st_size != record.size:
            raise InvalidInput(f"{origin} does not match the sha256 in its manifest: the artifact was changed after "
                             "export; re-export it (or restore the file)")
        files[name] = record.to_dict()
    signed = (source / SIGNATURE).is_file() and not (source / SIGNATURE).is_symlink()
    carried = [MANIFEST, *([SIGNATURE] if signed else [])]  # kvembed sign's signature travels
    for name in carried:
        shutil.copy2(source / name, dest / name)
        files[name] = {"sha256": sha256_file(dest / name), "bytes": (dest / name).stat().st_size}
    return {
        "path": f"artifacts/{dest.name}", "method": manifest.method.name, "precision": manifest.precision,
        "dim": manifest.dim, "max_length": manifest.max_length, "kvembed_version": manifest.kvembed_version,
        "copy": "+".join(sorted(how)) or "none", "signed": SIGNATURE in files, "files": files,
    }
