"""Where a model comes from, decided fast and before torch loads.

A ``--model`` value is a local folder, an alias (``qwen3-4b``, ``stories260k``) or a hub id. The
hub is only tried when the name is neither a folder nor in the local hub cache, and only after a
~3 s reachability probe: huggingface_hub's own retries take far longer to give up on a machine
without network. :func:`preflight` then checks the method, its options and ``--also``
against the model's ``config.json`` so that a mistyped option fails in a second, not after the
weights load. Torch-free (huggingface_hub comes with tokenizers).
"""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import urlparse

from ..artifact.layout import is_artifact
from ..errors import LINE_WIDTH, InvalidInput, ModelNotFound, ModelNotLocal, shown
from ..methods import get_method, resolve, resolve_model
from ..methods.sentence_transformers import folder_method, is_folder
from ..methods.models import alias_hint
from ..methods.architectures import architecture_of
from ..methods.layers import AUTO

#: seconds the hub reachability probe waits for a TCP connection
PROBE_TIMEOUT = 3.0
#: ``org/name`` or ``name``: what the hub accepts as a repository id
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")
_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_HOW_TO = (
    "download the model on a machine with network and pass its folder (config.json, *.safetensors, "
    "tokenizer.json) or a .gguf file instead of the name (e.g. --model /path/to/folder-or-file.gguf)"
)


@dataclass(frozen=True)
class ModelSource:
    """A located model: ``location`` is a local model folder, a GGUF file (then ``gguf`` holds its
    header facts, a :class:`~kvembed.modeling.gguf.GGUFInfo`), or a hub id."""

    requested: str
    location: str
    preset_id: str | None
    gguf: Any = None

    def config(self) -> dict[str, Any] | None:
        """The model's ``config.json`` as a dict (for a GGUF, the header's facts: no activation, so
        its architecture entry's own); None for a hub id."""
        if self.gguf is not None:
            return {"model_type": self.gguf.model_type, "num_hidden_layers": self.gguf.num_layers}
        path = Path(self.location) / "config.json"
        if not path.parent.is_dir():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise ModelNotFound(f"cannot read {path}: {err}") from None


def looks_like_path(text: str) -> bool:
    """True when ``text`` is written as a file-system path rather than a hub id."""
    return (
        text.startswith((".", "/", "~"))
        or "\\" in text
        or text.count("/") > 1
        or text.endswith(".gguf")
        or not _HUB_ID.match(text)
    )


def hub_offline() -> bool:
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on") for name in _OFFLINE_VARIABLES)


def hub_unreachable(timeout: float = PROBE_TIMEOUT) -> str | None:
    """Why the hub endpoint (``HF_ENDPOINT``) cannot be reached, or None when a TCP connection opens."""
    from huggingface_hub import constants

    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    parsed = urlparse(endpoint)
    host = parsed.hostname
    if not host:
        return f"HF_ENDPOINT={endpoint!r} is not a URL"
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as err:
        return f"{endpoint} is unreachable ({' '.join(str(err).split()) or type(err).__name__})"


def cached_snapshot(hub_id: str, revision: str | None = None) -> str | None:
    """The local hub-cache folder of ``hub_id`` when its config.json is cached, else None."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(hub_id, "config.json", revision=revision)
    except Exception:  # a malformed id or cache: not cached
        return None
    return str(Path(found).parent) if isinstance(found, str) else None


#: the longest model argument looked up: longer is no folder (PATH_MAX), alias or hub id
MAX_MODEL_TEXT = 4096


def locate_model(model: str | os.PathLike[str], revision: str | None = None) -> ModelSource:
    """Resolve what a user typed to a :class:`ModelSource`, failing within seconds when nothing is there."""
    text = str(model)
    if len(text) > MAX_MODEL_TEXT or "\x00" in text:  # no path, alias or hub id is (the OS refuses it mid-check)
        shown = f"{text[:60]!r}..." if len(text) > 60 else repr(text)
        raise ModelNotFound(f"{shown} ({len(text)} characters) is not a model folder, alias or hub id; {_HOW_TO}")
    from .packaged import ensure_packaged

    ensure_packaged(text)  # a multi-part packaged GGUF: joined into the cache once
    location, preset_id = resolve_model(text)
    path = Path(location).expanduser()
    if path.suffix.lower() == ".gguf" and not path.is_file():
        raise ModelNotFound(f"no GGUF file at {text!r}")
    from .gguf import find_gguf, read_info

    gguf_file = find_gguf(path) if path.exists() else None
    if gguf_file is not None:  # header checked now (a second); dequantized when loaded
        return ModelSource(text, str(gguf_file), preset_id, gguf=read_info(gguf_file))
    if path.is_dir():
        if not (path / "config.json").is_file():
            hint = (
                " (it is a kvembed artifact: embed with `kvembed embed ARTIFACT TEXT...`)"
                if is_artifact(path)
                else ""
            )
            raise ModelNotFound(
                f"{text!r} is a folder without config.json, so not a model folder{hint}; a model folder "
                f"holds config.json, weights (*.safetensors) and tokenizer.json"
            )
        return ModelSource(text, str(path), preset_id)
    if path.exists():
        raise ModelNotFound(f"{text!r} is a file, not a model folder; pass the folder holding config.json and the weights")
    if looks_like_path(text) and location == text:
        hint = alias_hint(text)
        raise ModelNotFound(f"no model folder at {text!r}; {hint + ' ' if hint else ''}{_HOW_TO}")
    cached = cached_snapshot(location, revision)
    if cached is not None:
        return ModelSource(text, cached, preset_id)
    if hub_offline():
        raise not_local(text, location, "HF_HUB_OFFLINE is set")
    reason = hub_unreachable()
    if reason is not None:
        raise not_local(text, location, "the hub cannot be reached", reason)
    return ModelSource(text, location, preset_id)


def sentence_transformers_folder(model: str | os.PathLike[str], revision: str | None = None) -> str:
    """The local folder of the sentence-transformers model ``model`` names: the folder itself, or an
    alias or hub id (:data:`~kvembed.methods.models.TRAINED_EMBEDDERS`) from the hub cache, downloaded
    whole when the hub is reachable (a model's own files alone lack modules.json and the pooling)."""
    if is_folder(model):
        return str(model)
    source = locate_model(model, revision)
    if source.gguf is not None or Path(source.location).is_dir():
        return source.location  # not a sentence-transformers folder: folder_method says so
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(source.location, revision=revision)
    except Exception as err:  # gated, missing, or the connection lost mid-download: one line, not a traceback
        raise ModelNotFound(f"cannot download {shown(source.location)} from the hub ({type(err).__name__}: {shown(str(err))})") from None


#: how the first line of an error begins on the command line (``error: ``), within its width
_PREFIX = len("error: ")


def _fitted(variants: Sequence[str], width: int = LINE_WIDTH) -> str:
    """The first of ``variants`` (longest, most telling first) that fits ``width``, else the last cut to it."""
    for variant in variants:
        if len(variant) <= width:
            return variant
    return variants[-1][: width - 3] + "..."


def not_local(text: str, location: str, why: str, reason: str | None = None) -> ModelNotLocal:
    """The error of a model that is not local, not in the hub cache, and the hub out of reach
    (``why``; ``reason``: the probe's words, kept where they fit): what failed on one line, then the
    fixes on two, each within :data:`~kvembed.errors.LINE_WIDTH` as the command line prints them."""
    names = [f"{shown(text)} ({location})", shown(text)] if location != text else [shown(text)]
    failed = [f"{name} is not local or in the hub cache, and {why}" for name in [*names, f"{text[:24]!r}..."]]
    if location != text:  # a long alias: its hub id kept, the words shortened
        failed.insert(1, f"{names[0]}: not local or cached; {why}")
    first = _fitted([*(f"{failed[0]} ({reason})" for _ in [reason] if reason), *failed], LINE_WIDTH - _PREFIX)
    hint = alias_hint(text)
    path = "pass a local model folder or a .gguf file: --model /path/to/folder-or-file.gguf"
    fix = _fitted([f"  fix: {hint} Or pass a model folder or a .gguf file: --model /path/to/it",
                   f"  fix: {hint} Or --model /path/to/folder-or-file.gguf"] if hint else [f"  fix: {path}"])
    then = "keep HF_HUB_OFFLINE=1" if hub_offline() else "set HF_HUB_OFFLINE=1"
    cache = _fitted([f"  or: hf download {location} elsewhere, copy the hub cache here and {then}",
                     f"  or: hf download {location} online, copy its hub cache here, {then}",
                     f"  or: hf download it elsewhere, copy the hub cache here and {then}"])
    return ModelNotLocal("\n".join((first, fix, cache)))


def model_config(source: ModelSource, revision: str | None = None) -> Mapping[str, Any]:
    """``config.json`` of a located model (from the hub for a remote one)."""
    local = source.config()
    if local is not None:
        return local
    from huggingface_hub import hf_hub_download

    try:
        path = hf_hub_download(source.location, "config.json", revision=revision)
    except Exception as err:
        hint = alias_hint(source.requested)
        raise ModelNotFound(f"cannot get config.json of {source.location!r} from the hub ({type(err).__name__}: {err})"
                            f"{'; ' + hint if hint else ''}") from None
    return json.loads(Path(path).read_text(encoding="utf-8"))


def preflight(
    model: str | os.PathLike[str],
    method: str,
    options: Mapping[str, Any] | None = None,
    also: Sequence[Any] = (),
    revision: str | None = None,
) -> ModelSource:
    """Check the model location, architecture, method, options and ``also`` before weights load.

    Raises :class:`~kvembed.errors.ModelNotFound` or ValueError with the same messages the full load
    would give; returns the located model.
    """
    from ..methods.sharing import resolve_also

    spec = get_method(method)
    if spec.contextual:  # a Causal2Vec checkpoint folder: its layout, then its LLM
        from .causal2vec import Causal2VecCheckpoint

        if also:
            raise InvalidInput("causal2vec cannot take --also: its Contextual token makes its forward pass its own")
        checkpoint = Causal2VecCheckpoint.read(model)
        config = json.loads((checkpoint.llm / "config.json").read_text(encoding="utf-8"))
        architecture_of(config)
        resolve(spec, int(config.get("num_hidden_layers") or 0), None, **{**checkpoint.method_options(), **dict(options or {})})
        return ModelSource(str(model), str(checkpoint.root), None)
    options = dict(options or {})
    if spec.name == "st":  # a trained embedder's folder: its pooling and prompts
        model, options = folder_method(sentence_transformers_folder(model, revision), options)
    source = locate_model(model, revision)
    config = model_config(source, revision)
    architecture_of(config)
    num_layers = config.get("num_hidden_layers")
    if not isinstance(num_layers, int) or num_layers < 1:
        raise InvalidInput(f"{source.requested!r}: config.json has no valid num_hidden_layers")
    auto = isinstance(options.get("layers"), str) and options["layers"].strip().lower() == AUTO
    auto = auto and spec.name == "kv-embedding"  # elsewhere resolve() refuses 'auto' with its own message
    if auto:
        options["layers"] = "none"  # the set is chosen after loading; check the rest now
    resolved = resolve(spec, num_layers, source.preset_id, **options)
    if not auto:
        resolve_also(resolved, list(also), source.preset_id)
    return source
