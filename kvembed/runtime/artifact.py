"""The artifact directory: ``model.onnx`` (+ ``model.onnx.data``), ``tokenizer.json``, ``kvembed.json``.

The manifest schema lives here, in the torch-free runtime, because both sides need it: the
exporter writes it, :class:`kvembed.runtime.Embedder` reads it back without torch or transformers.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

from ..methods.spec import ResolvedMethod
from .encoding import TextEncoder

SCHEMA_VERSION = 1
MANIFEST = "kvembed.json"
TOKENIZER = "tokenizer.json"
#: Causal2Vec artifacts: the context encoder's tokenizer
ENCODER_TOKENIZER = "encoder_tokenizer.json"
MODEL = "model.onnx"

#: manifest keys every artifact has (tests and loaders rely on them)
REQUIRED_KEYS = (
    "schema_version",
    "kvembed_version",
    "source",
    "method",
    "dim",
    "max_length",
    "opset",
    "precision",
    "padding_side",
    "placeholder_id",
    "pad_id",
    "fallback_id",
    "inputs",
    "outputs",
    "graph",
    "files",
    "parity",
)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while True:
            block = handle.read(chunk)
            if not block:
                break
            digest.update(block)
    return digest.hexdigest()


def file_records(directory: Path) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file in ``directory`` except the manifest itself."""
    records = {}
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.name != MANIFEST:
            records[path.name] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    return records


def write_manifest(directory: Path, manifest: Mapping[str, Any]) -> Path:
    path = directory / MANIFEST
    text = json.dumps(manifest, indent=2, sort_keys=False, ensure_ascii=False) + "\n"
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of an artifact directory; FileNotFoundError / ValueError say what is wrong."""
    directory = Path(directory)
    made_by = f"an artifact directory holds {MANIFEST}, model.onnx and tokenizer.json, written by kvembed-export"
    if not directory.is_dir():
        raise FileNotFoundError(f"no artifact directory at {str(directory)!r}; {made_by}")
    path = directory / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{str(directory)!r} is not a kvembed artifact: it has no {MANIFEST}; {made_by}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    version = manifest.get("schema_version")
    if not isinstance(version, int) or version < 1:
        raise ValueError(f"{path} has no valid schema_version (got {version!r}); is it a kvembed manifest?")
    if version > SCHEMA_VERSION:
        raise ValueError(
            f"{path} has schema_version {version}, newer than this kvembed reads ({SCHEMA_VERSION}): "
            "upgrade kvembed (pip install -U kvembed) to load this artifact"
        )
    if version < SCHEMA_VERSION:
        raise ValueError(f"{path} has schema_version {version}, older than {SCHEMA_VERSION}: re-export the model")
    missing = [key for key in REQUIRED_KEYS if key not in manifest]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}")
    return manifest


def check_files(directory: str | os.PathLike[str], manifest: Mapping[str, Any] | None = None) -> list[str]:
    """Problems with the artifact's files (missing, wrong size or hash); empty when all is well."""
    directory = Path(directory)
    manifest = read_manifest(directory) if manifest is None else manifest
    problems = []
    for name, record in manifest["files"].items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{name} is missing")
            continue
        if path.stat().st_size != record["bytes"]:
            problems.append(f"{name} has {path.stat().st_size} bytes, manifest says {record['bytes']}")
        elif sha256_file(path) != record["sha256"]:
            problems.append(f"{name} does not match its sha256 in the manifest")
    return problems


def encoder_from_manifest(directory: str | os.PathLike[str], manifest: Mapping[str, Any]) -> TextEncoder:
    """Rebuild the artifact's TextEncoder from ``tokenizer.json`` and the manifest (torch-free)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(directory) / TOKENIZER))
    method = ResolvedMethod.from_dict(manifest["method"])
    context: dict[str, Any] = {}
    if manifest.get("context_encoder"):
        spec = manifest["context_encoder"]
        context = {
            "context_tokenizer": Tokenizer.from_file(str(Path(directory) / spec["tokenizer"])),
            "context_max_length": int(spec["max_length"]),
            "context_pad_id": int(spec["pad_id"]),
        }
    encoder = TextEncoder(
        tokenizer,
        method,
        int(manifest["max_length"]),
        fallback_id=int(manifest["fallback_id"]),
        pad_id=int(manifest["pad_id"]),
        padding_side=str(manifest.get("padding_side", "right")),
        **context,
    )
    if method.placeholder and encoder.placeholder_id != manifest["placeholder_id"]:
        raise ValueError(
            f"tokenizer.json gives the placeholder id {encoder.placeholder_id}, the manifest says "
            f"{manifest['placeholder_id']}"
        )
    return encoder
