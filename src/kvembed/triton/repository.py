"""Write a Triton model repository for one or several kvembed artifacts.

Per artifact ``<name>``: ``<name>_tokenize`` (python backend, the runtime's ``TextEncoder``),
``<name>_model`` (the graph: python backend running onnxruntime, Triton's onnxruntime backend, or
a TensorRT plan: an engine directory's from ``kvembed build-engine``, or built on the target GPU
with the generated script) and the ensemble ``<name>`` (TEXT [+ KIND] -> embedding).
The directory is self-contained (artifact files and the runtime code are placed in it: see
:func:`place_file` for the weights) and is written by the staged writer
(:func:`kvembed.artifact.staging.staged`), so a failure never leaves a half-written repository.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from tritonclient.utils import serialize_byte_tensor

from ..artifact import MANIFEST, MODEL, TOKENIZER, Manifest, check_intact, load_manifest
from ..artifact.staging import check_output, staged
from ..artifact.engine import PLAN, is_engine_dir, read_engine_json
from ..runtime.artifact import encoder_from_manifest
from .configs import ArtifactFacts, ensemble_config, model_config, plan_build_command, tokenize_config, write_config
from .options import ServingOptions
from .readme import repository_readme
from .vendor import copy_runtime
from ..errors import InvalidInput

BACKEND_DIR = Path(__file__).resolve().parent / "backend"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
VERSION = "1"
WARMUP_TEXT = "A short sentence to warm the model up."
#: files from this size on count as weights (hard-linked where the filesystem allows), whatever their name
LINK_MIN_BYTES = 64 * 1024**2
#: ``say(line)``: how a repository write reports what the caller should know (a copied big file)
Say = Callable[[str], None]


@dataclass(frozen=True)
class Entry:
    """One artifact placed in the repository, with its manifest as read once (and checked)."""

    artifact: Path
    facts: ArtifactFacts
    manifest: Manifest


def default_name(artifact: Path) -> str:
    """A model name from the artifact directory's name (``stories260k-kv`` stays as it is)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", artifact.resolve().name).strip("_.-")
    return name or "kvembed"


def plan_entries(artifacts: Sequence[str | os.PathLike[str]], names: Sequence[str] | None) -> list[Entry]:
    """Read and check every artifact (files against their sha256) and name its models."""
    paths = [Path(item) for item in artifacts]
    if not paths:
        raise InvalidInput("give at least one artifact directory")
    if names and len(names) != len(paths):
        raise InvalidInput(f"{len(names)} --name value(s) for {len(paths)} artifact(s); give one name per artifact, in order")
    chosen = list(names) if names else [default_name(path) for path in paths]
    for name in chosen:
        if not NAME.match(name):
            raise InvalidInput(f"model name {name!r} must start with a letter or digit and use only letters, digits, '_', '.', '-'")
    taken = [f"{n}{suffix}" for n in chosen for suffix in ("", "_tokenize", "_model")]
    duplicates = sorted({n for n in taken if taken.count(n) > 1})
    if duplicates:
        raise InvalidInput(f"model names collide ({', '.join(duplicates)}); pass distinct --name values")
    entries = []
    for path, name in zip(paths, chosen):
        engine = read_engine_json(path) if is_engine_dir(path) else None
        manifest = check_intact(load_manifest(path), engine)
        if manifest.context_encoder is not None:
            raise InvalidInput(
                f"artifact {str(path)!r} is a Causal2Vec artifact (two token sequences per text); kvembed triton does "
                "not write repositories for it yet: serve it with `kvembed serve` or embed with the runtime"
            )
        entries.append(Entry(path, ArtifactFacts.from_manifest(name, manifest, engine), manifest))
    return entries


def write_repository(
    artifacts: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    out: str | os.PathLike[str],
    names: Sequence[str] | str | None = None,
    *,
    force: bool = False,
    say: Say | None = None,
    **settings: Any,
) -> Path:
    """Write a Triton model repository serving ``artifacts`` to ``out``; returns its path.

    ``settings`` are :class:`ServingOptions`' fields, those of ``kvembed triton build``. Raises
    ValueError / FileNotFoundError / FileExistsError naming the problem before writing anything.
    ``say`` gets one line when big weights had to be copied instead of hard-linked (:func:`place_file`).
    """
    if isinstance(artifacts, (str, os.PathLike)):
        artifacts = [artifacts]
    if isinstance(names, str):
        names = [names]
    known = [f.name for f in fields(ServingOptions)]
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise TypeError(f"write_repository() has no option {', '.join(unknown)}; the options are {', '.join(known)}")
    options = ServingOptions(**settings)
    entries = plan_entries(list(artifacts), list(names) if names else None)
    engines = [str(entry.artifact) for entry in entries if entry.facts.engine is not None]
    if engines and options.backend != "tensorrt":
        raise InvalidInput(f"{', '.join(engines)}: a TensorRT engine directory is served with --backend tensorrt (its plan "
                         f"is the model); for --backend {options.backend} give the artifact it was built from")
    pinned = [f"{entry.artifact} ({', '.join(f'{k}={v}' for k, v in entry.manifest.graph.session_config.items())})"
              for entry in entries if entry.manifest.graph.session_config]
    if pinned and options.backend == "onnxruntime":  # its model config has no key for session config entries
        raise InvalidInput(f"{'; '.join(pinned)}: the gate ran this graph with onnxruntime session settings Triton's "
                           "onnxruntime backend cannot set, so it would compute something uncertified; serve it with "
                           "--backend python (the default), which sets them, or export int8 with --int8-recipe smooth-rows")
    target = check_output(out, force)  # a file is refused even with --force (NotADirectoryError)
    copied: list[Path] = []
    with staged(target) as staging:
        for entry in entries:
            _write_entry(staging, entry, options, copied)
        (staging / "README.md").write_text(repository_readme([e.facts for e in entries], options), encoding="utf-8")
    if copied and say is not None:
        size = sum(path.stat().st_size for path in copied) / 1e9
        say(f"copied {len(copied)} weight file(s) ({size:.1f} GB) into the repository: it is on another filesystem "
            f"than {', '.join(sorted({str(p.parent) for p in copied}))} (or the filesystem has no hard links)")
    return target


def _write_entry(root: Path, entry: Entry, options: ServingOptions, copied: list[Path]) -> None:
    facts = entry.facts
    options = facts.serving_options(options)
    manifest = entry.manifest
    encoder = encoder_from_manifest(entry.artifact, manifest)
    encoder.cap_input_tokens(facts.max_length)
    encoder.pad_at_least(facts.min_sequence)
    warm_batch = encoder.pad(encoder.encode([WARMUP_TEXT], "document"))

    tokenize = root / facts.tokenize
    write_config(tokenize, tokenize_config(facts, options))
    _python_model(tokenize / VERSION, "tokenize_model.py", entry.artifact, [TOKENIZER, MANIFEST], copied)
    if options.warmup:
        text = serialize_byte_tensor(np.array([WARMUP_TEXT.encode("utf-8")], dtype=object))
        _warmup_file(tokenize, "text", text.tobytes() if text.dtype != object else text.item())

    model = root / facts.model
    write_config(model, model_config(facts, options, sequence=int(warm_batch["input_ids"].shape[1])))
    graph_files = [name for name in manifest.files if name.startswith(MODEL)]
    if options.backend == "python":
        _python_model(model / VERSION, "onnx_model.py", entry.artifact, [*manifest.files, MANIFEST], copied)
    elif options.backend == "onnxruntime":
        _copy(entry.artifact, model / VERSION, graph_files, copied)
    elif facts.engine is not None:  # kvembed build-engine's plan, built on the serving GPU
        (model / VERSION).mkdir(parents=True, exist_ok=True)
        if not place_file(entry.artifact / PLAN, model / VERSION / "model.plan"):
            copied.append(entry.artifact / PLAN)
    else:
        _copy(entry.artifact, model / "onnx", graph_files, copied)
        (model / VERSION).mkdir(parents=True, exist_ok=True)
        script = model / "build_plan.sh"
        command = plan_build_command(facts, options, onnx='"$here/onnx/model.onnx"', plan=f'"$here/{VERSION}/model.plan"')
        script.write_text(
            "#!/usr/bin/env sh\n# Build the TensorRT plan on the GPU that will serve it (TensorRT engines are not portable).\n"
            f'set -e\nhere="$(cd "$(dirname "$0")" && pwd)"\n{command}\n',
            encoding="utf-8",
        )
        script.chmod(0o755)
    if options.warmup:
        for name in facts.inputs:
            _warmup_file(model, name, np.ascontiguousarray(warm_batch[name][0], dtype=np.int64).tobytes())

    ensemble = root / facts.name
    write_config(ensemble, ensemble_config(facts, options))
    (ensemble / VERSION).mkdir(exist_ok=True)


def _python_model(version_dir: Path, source: str, artifact: Path, files: Sequence[str], copied: list[Path]) -> None:
    """``model.py`` + the runtime code + the artifact files it reads, in one version directory."""
    version_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(BACKEND_DIR / source, version_dir / "model.py")
    copy_runtime(BACKEND_DIR / source, version_dir)
    _copy(artifact, version_dir / "artifact", files, copied)


def _copy(source: Path, target: Path, files: Sequence[str], copied: list[Path]) -> None:
    """Place ``files`` of ``source`` in ``target`` (:func:`place_file`); weights that had to be copied go to ``copied``."""
    target.mkdir(parents=True, exist_ok=True)
    for name in dict.fromkeys(files):
        if not place_file(source / name, target / name):
            copied.append(source / name)


#: link(2) errors that mean "this filesystem pair cannot link": copy instead
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EACCES}


def is_weights(path: Path) -> bool:
    """The files worth linking: the graph's external data, a TensorRT plan, anything of
    :data:`LINK_MIN_BYTES` or more (a graph that carries its weights inline)."""
    return path.name.endswith(".data") or path.name == PLAN or path.stat().st_size >= LINK_MIN_BYTES


def place_file(source: Path, target: Path) -> bool:
    """Put ``source`` at ``target``: weights (:func:`is_weights`) as a hard link where both are on
    one filesystem, else as a copy; False when weights had to be copied.

    Triton reads a model's files from the repository directory, so they must be there. A hard link
    costs no space or time for multi-GB weights and, unlike a symlink, stays valid when the artifact
    directory is moved or deleted (the data lives until its last name goes); the exporter writes an
    artifact to a new directory and renames it into place, so re-exporting never rewrites a linked
    file under a built repository. Small files (graph, manifest, tokenizer) are copied, so editing
    them in one place never changes the other."""
    if not is_weights(source):
        shutil.copy2(source, target)
        return True
    try:
        os.link(source.resolve(), target)  # a link inside the artifact: its file, not the link itself
        return True
    except OSError as err:
        if err.errno not in _NO_LINK:
            raise
    shutil.copy2(source, target)
    return False


def _warmup_file(model_dir: Path, name: str, data: bytes) -> None:
    folder = model_dir / "warmup"
    folder.mkdir(exist_ok=True)
    (folder / name).write_bytes(data)
