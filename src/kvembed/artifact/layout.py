"""What an artifact directory holds, by name, and the one test of "is this an artifact?".

Every command that takes an artifact (embed, serve, triton, bundle, corpus, eval, bench) decides it
here, so a directory is an artifact for all of them or for none.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import InvalidInput

#: the manifest: what the graph computes, how to tokenise for it, and every file's sha256
MANIFEST = "kvembed.json"
#: the signature of the whole folder (``kvembed sign``: every file, the manifest included, but
#: itself), an OpenSSF model-signing bundle; a loader given a trust key checks it
SIGNATURE = "kvembed.sig"
#: the ONNX graph (its weights in ``model.onnx.data`` beside it once they pass the 2 GB protobuf limit)
MODEL = "model.onnx"
#: the graph's external weights
MODEL_DATA = MODEL + ".data"
#: an int8 artifact's graph as OpenVINO runs it best: the same int8 weights (``model.onnx.data``),
#: dequantised before float MatMuls instead of onnxruntime's integer MatMuls on quantised
#: activations; the manifest's ``graphs`` names it
OPENVINO_MODEL = "model.openvino.onnx"
TOKENIZER = "tokenizer.json"
#: Causal2Vec artifacts: the context encoder's tokenizer
ENCODER_TOKENIZER = "encoder_tokenizer.json"
#: an engine directory (``kvembed build-engine``: the artifact's manifest and tokenizer beside a
#: TensorRT plan): the plan, and the record of its build that names the plan's sha256
PLAN, ENGINE_JSON = "engine.plan", "engine.json"
#: for messages: what an artifact directory holds and what writes it
ARTIFACT_FILES = f"{MANIFEST}, {MODEL} and {TOKENIZER}, written by kvembed-export"
#: the longest file name a manifest may list (most filesystems' own limit)
LONGEST_NAME = 255
#: a name given to an artifact (``NAME=DIR``, or its folder's name): it ends up in URLs, metrics
#: labels, result files, shell scripts and systemd units, so it stays plain
ARTIFACT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a file of an artifact, or None when it can: an artifact is one closed
    folder, so every file it lists is a plain name in that folder (no separator, no ``..``, no
    absolute path, no control character). Every reader gets this through the manifest's parse."""
    if not isinstance(name, str) or not name:
        return "is not a file name"
    if len(name) > LONGEST_NAME:
        return f"is longer than {LONGEST_NAME} characters"
    if "/" in name or "\\" in name or name in (".", ".."):
        return "is a path, not a file name in the artifact folder"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "holds a control character"
    return None


def is_artifact(path: str | os.PathLike[str] | None) -> bool:
    """Whether ``path`` is an artifact directory (it holds the manifest); ``~`` is expanded.

    Only the manifest's presence is tested, so this is cheap enough to decide how to read an
    argument; :func:`kvembed.artifact.load_manifest` then checks what it says."""
    return path is not None and (Path(path).expanduser() / MANIFEST).is_file()


def split_name(value: str) -> tuple[str | None, str]:
    """``NAME=DIR`` -> (NAME, DIR); anything else -> (None, value): a value that exists as a path
    is never split, nor one whose head is no plain name (a path holding ``=``)."""
    head, sep, tail = value.partition("=")
    if sep and tail and ARTIFACT_NAME.fullmatch(head) and not Path(value).expanduser().exists():
        return head, tail
    return None, value


def named_directory(value: str) -> tuple[str, Path]:
    """The one ``DIR`` or ``NAME=DIR`` rule (serve, bundle, eval): a directory named ``NAME``, or
    after its folder; a name that is not plain is refused in one line."""
    name, path = split_name(value)
    head, sep, _ = value.partition("=")
    if name is None and sep and head and not Path(value).expanduser().exists():
        raise InvalidInput(f"model name {head!r} (from {value!r}) must be letters, digits, '.', '_', '+' or '-': use NAME=DIR")
    directory = Path(path).expanduser()
    if name is None:
        name = directory.resolve().name
        if not ARTIFACT_NAME.fullmatch(name):
            raise InvalidInput(f"the folder name {name!r} of {value!r} is no plain model name (letters, digits, "
                               "'.', '_', '+', '-'): name it with NAME=DIR")
    return name, directory
