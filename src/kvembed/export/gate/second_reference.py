"""The second reference of a sentence-transformers folder's export: sentence-transformers itself.

The parity gate proves the graph computes what kvembed's PyTorch reference computes; for a trained
embedder's folder (the ``st`` method) that reference must in turn be what the folder's own library
computes, or the artifact would be faithful to the wrong recipe. sentence-transformers embeds the
gate's core texts, as queries and as documents with the prompts kvembed took from the folder,
*before* kvembed loads the weights (one copy in memory at a time); kvembed's reference then embeds
the same texts and every row must agree within docs/methods.md's fp32 bar. The result goes into
the manifest's source record. Without sentence-transformers installed the export says so and
records that the comparison did not run.
"""

from __future__ import annotations

import gc
import importlib.util
from typing import Any, Mapping

import numpy as np

from ...artifact.certificates import TOLERANCES
from ...methods.registry import TEXT
from ...methods.sentence_transformers import folder_method
from ...methods.spec import KINDS
from ..graph.trace import ExportError
from .parity import cosine_rows
from .texts import PARITY_TEXTS

LIBRARY = "sentence-transformers"
#: the core texts both sides embed: each shorter than any folder's max_seq_length, so neither side cuts one
TEXTS = {name: text for name, text in PARITY_TEXTS.items() if name != "long"}


class SecondReferenceError(ExportError):
    """kvembed's reference does not compute what sentence-transformers computes on the folder."""


def prompts_of(templates: Mapping[str, str]) -> dict[str, str] | None:
    """kind -> the prompt sentence-transformers prepends, or None when a template is not ``prompt + {text}``."""
    if not all(template.endswith(TEXT) and template.count(TEXT) == 1 for template in templates.values()):
        return None
    return {kind: template[: -len(TEXT)] for kind, template in templates.items()}


def expected_vectors(model: str, options: Mapping[str, Any]) -> tuple[dict[str, np.ndarray] | None, str]:
    """sentence-transformers' normalised vectors of :data:`TEXTS` per kind on the folder ``model``,
    with the prompts of the ``st`` options, and why not (None) when it cannot run; the model is
    freed before this returns."""
    if importlib.util.find_spec("sentence_transformers") is None:
        return None, f"{LIBRARY} is not installed: the folder's vectors were checked against kvembed's reference only"
    _, resolved = folder_method(model, options)
    prompts = prompts_of({kind: resolved[f"{kind}_template"] for kind in KINDS})
    if prompts is None:
        return None, "a template given is not the folder's prompt followed by {text}: no sentence-transformers prompt is the same"
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the export reports its own stages
    reference = SentenceTransformer(str(model), device="cpu", local_files_only=True)
    try:
        texts = list(TEXTS.values())
        return {kind: reference.encode(texts, prompt=prompts[kind], normalize_embeddings=True, convert_to_numpy=True)
                for kind in KINDS}, ""
    finally:
        del reference
        gc.collect()


def summary(record: Mapping[str, Any]) -> str:
    """The export's line for the record :func:`compare` made."""
    if not record["compared"]:
        return f"second reference: not compared ({record['why_not']})"
    return (f"second reference: {LIBRARY} {record['version']} on the folder, worst cosine {record['worst_cosine']:.6f} "
            f"over {record['texts']} texts")


def compare(embedder: Any, expected: Mapping[str, np.ndarray] | None, why_not: str) -> dict[str, Any]:
    """The manifest's record of kvembed's reference against sentence-transformers; a
    :class:`SecondReferenceError` naming the worst text when a row misses the fp32 bar."""
    if expected is None:
        return {"library": LIBRARY, "compared": False, "why_not": why_not}
    import sentence_transformers

    bar = TOLERANCES["fp32"]["min_cosine"]
    names, worst = list(TEXTS), (1.0, "", "")
    for kind in KINDS:
        got = embedder.encode(list(TEXTS.values()), kind=kind)
        cosines = cosine_rows(got, expected[kind])  # the gate's: two equal zero rows agree
        index = int(np.argmin(cosines))
        if float(cosines[index]) < worst[0]:
            worst = (float(cosines[index]), kind, names[index])
    if worst[0] < bar:
        raise SecondReferenceError(
            f"kvembed's reference misses {LIBRARY}'s own vectors on this folder: worst cosine {worst[0]:.6f} < {bar} "
            f"({worst[1]} {worst[2]!r}); the folder holds something the st method does not compute")
    return {"library": LIBRARY, "version": sentence_transformers.__version__, "compared": True,
            "texts": len(TEXTS) * len(KINDS), "worst_cosine": round(worst[0], 7)}
