"""A trained decoder embedder as it ships: a sentence-transformers folder (Qwen3-Embedding,
gte-Qwen2, e5-mistral, SFR-Embedding-Mistral), read without sentence-transformers or torch.

The folder's ``modules.json`` lists its modules: a ``Transformer`` (the decoder, at the folder's
root or in a sub-folder), a ``Pooling`` (``1_Pooling/config.json``: last token or mean) and
usually a ``Normalize``. ``config_sentence_transformers.json`` names its prompts, prepended to the
text as sentence-transformers does (``prompt + text``). The tokenizer's own post-processor adds
the EOS such a model was trained with, so it needs nothing here. kvembed computes the embedding as
its ``st`` method: the folder's pooling of the final normed hidden states, the folder's prompts
for queries and documents.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import InvalidInput, shown
from .spec import KINDS

MODULES = "modules.json"
SETTINGS = "config_sentence_transformers.json"
#: sentence-transformers' module types kvembed reads (the last part of each ``type``)
TRANSFORMER, POOLING, NORMALIZE = "Transformer", "Pooling", "Normalize"
#: Pooling's config key -> kvembed's pooling of final hidden states
POOLINGS = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean"}
#: the prompt names that are a query's and a document's (the first found is used)
QUERY_PROMPTS = ("query", "web_search_query")
DOCUMENT_PROMPTS = ("document", "passage", "doc", "corpus")
#: the longest prompt kvembed takes from a folder (a prompt is prepended to every text)
LONGEST_PROMPT = 4000


def is_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a sentence-transformers model folder (it has ``modules.json``)."""
    return (Path(path) / MODULES).is_file()


@dataclass(frozen=True)
class SentenceTransformersFolder:
    """What kvembed reads of a sentence-transformers folder."""

    root: Path
    transformer: Path
    """The decoder's folder (config.json, weights, tokenizer): the root or a module's sub-folder."""
    pooling: str
    normalize: bool
    prompts: Mapping[str, str]

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> "SentenceTransformersFolder":
        """The folder at ``path``, checked: one line naming the file and the fix for anything kvembed cannot compute."""
        root = Path(path)
        modules = _json(root / MODULES)
        if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
            raise InvalidInput(f"{root / MODULES}: expected a list of modules, as SentenceTransformer.save() writes")
        kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules}
        unknown = [kind for kind in kinds if kind not in (TRANSFORMER, POOLING, NORMALIZE)]
        if unknown or TRANSFORMER not in kinds or POOLING not in kinds:
            raise InvalidInput(f"{root / MODULES}: kvembed computes a Transformer, a Pooling and an optional Normalize module; "
                               f"this folder has {', '.join(shown(k) for k in kinds) or 'none'}")
        transformer = _inside(root, kinds[TRANSFORMER].get("path", ""))
        pooling_dir = _inside(root, kinds[POOLING].get("path", ""))
        return cls(root, transformer, _pooling(pooling_dir / "config.json"), NORMALIZE in kinds, _prompts(root / SETTINGS))

    def method_options(self) -> dict[str, Any]:
        """The ``st`` method options this folder fixes: its pooling and its prompts as templates, the
        query and document kinds from the first of their usual names, and every prompt but those two
        names under its own name too (a request may ask ``sts_query``, as sentence-transformers' ``prompt_name``)."""
        query = next((self.prompts[name] for name in QUERY_PROMPTS if name in self.prompts), "")
        document = next((self.prompts[name] for name in DOCUMENT_PROMPTS if name in self.prompts), "")
        named = {name: prompt + "{text}" for name, prompt in self.prompts.items() if name not in KINDS}
        return {"pooling": self.pooling, "query_template": query + "{text}", "document_template": document + "{text}",
                "named_prompts": named}


def folder_method(model: str | os.PathLike[str], options: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """For the ``st`` method: the decoder's folder inside the sentence-transformers folder ``model``,
    and the method options the folder fixes, under the caller's ``options``."""
    if not is_folder(model):
        raise InvalidInput(f"method st reads a sentence-transformers folder (its {MODULES}); {shown(str(model))} has none: "
                           "give the folder SentenceTransformer.save() wrote, or choose another --method")
    folder = SentenceTransformersFolder.read(model)
    return str(folder.transformer), {**folder.method_options(), **options}


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput(f"{path} is missing: the sentence-transformers folder is incomplete") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise InvalidInput(f"{path} is not readable JSON ({type(err).__name__}: {shown(str(err))})") from None


def _inside(root: Path, relative: Any) -> Path:
    """A module's folder, refused unless it is a plain relative path inside ``root``."""
    if not isinstance(relative, str) or relative.startswith(("/", "\\")) or ".." in Path(relative).parts:
        raise InvalidInput(f"{root / MODULES}: module path {shown(str(relative))} is not a folder inside the model folder")
    folder = (root / relative).resolve()
    if folder != root.resolve() and root.resolve() not in folder.parents:
        raise InvalidInput(f"{root / MODULES}: module path {shown(relative)} leaves the model folder")
    return root / relative if relative else root


def _pooling(path: Path) -> str:
    config = _json(path)
    if not isinstance(config, dict):
        raise InvalidInput(f"{path}: expected an object of pooling_mode_* switches")
    modes = [key for key, on in config.items() if key.startswith("pooling_mode_") and on is True]
    if len(modes) != 1 or modes[0] not in POOLINGS:
        raise InvalidInput(f"{path}: pooling {', '.join(modes) or 'none'} is not one kvembed computes; it computes "
                           f"{' or '.join(POOLINGS)} (the trained decoder embedders use pooling_mode_lasttoken)")
    if POOLINGS[modes[0]] == "mean" and config.get("include_prompt") is False:
        raise InvalidInput(f"{path}: mean pooling without the prompt's tokens (include_prompt: false) is not one kvembed computes")
    return POOLINGS[modes[0]]


def _prompts(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    settings = _json(path)
    prompts = settings.get("prompts") if isinstance(settings, dict) else None
    if prompts is None:
        return {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise InvalidInput(f"{path}: prompts must map prompt names to strings")
    long = [name for name, prompt in prompts.items() if len(prompt) > LONGEST_PROMPT]
    if long:
        raise InvalidInput(f"{path}: prompt {shown(long[0])} is over {LONGEST_PROMPT} characters")
    return dict(prompts)
