"""Vector types: the float vectors the graph returns as int8, uint8, binary or ubinary rows, the way
sentence-transformers' ``quantize_embeddings`` gives them (its ``precision``) and Cohere's
``embedding_types`` names them.

- ``int8`` / ``uint8``: each dimension's range ``[min, max]`` (:func:`calibration_ranges`; an
  artifact's own are in its manifest, ``vector_ranges``) is cut into 256 levels of width
  ``step = (max - min) / 255`` (a dimension with ``min == max`` gets ``step = 1``, as
  sentence-transformers does); a value's level is ``floor((x - min) / step)``, **clipped** into
  ``[0, 255]``: a value outside the calibrated range takes the end level, never wraps. uint8 is that
  level, int8 the level minus 128. The arithmetic is float32, as sentence-transformers' is, so the
  two give the same bytes.
- ``binary`` / ``ubinary``: one bit per dimension, set where the value is positive, packed eight to
  a byte with the first dimension in the highest bit (:func:`numpy.packbits`); a width that is not a
  multiple of eight is padded with zero bits at the end of the last byte, so a row holds
  ``ceil(dim / 8)`` bytes. ubinary is the packed uint8, binary the same byte minus 128 as int8.
- ``float``: the float32 vectors as they are.

The ranges are those of L2-normalised vectors, so int8 and uint8 are defined for normalised
vectors only. Numpy only: the server, the corpus jobs and the command line share this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import InvalidInput, shown, with_hint
from ..methods.sharing import output_names

#: the vector types, in the words Cohere's ``embedding_types`` uses (``float`` is float32)
VECTOR_TYPES: tuple[str, ...] = ("float", "int8", "uint8", "binary", "ubinary")
#: sentence-transformers' ``precision`` words for the same types (``float32`` is ``float``)
PRECISIONS: tuple[str, ...] = ("float32", "int8", "uint8", "binary", "ubinary")
#: the types whose levels need per-dimension ranges
RANGED = ("int8", "uint8")
#: the types packed eight dimensions to a byte
PACKED = ("binary", "ubinary")
#: the numpy dtype of each type's rows
DTYPES = {"float": np.dtype(np.float32), "int8": np.dtype(np.int8), "uint8": np.dtype(np.uint8),
          "binary": np.dtype(np.int8), "ubinary": np.dtype(np.uint8)}
#: how many texts of the bundled calibration set the ranges are measured on (each as every kind:
#: query and document prompts)
RANGE_TEXTS = 64
#: significant digits a manifest keeps of a range's ends
RANGE_DIGITS = 6
CALIBRATION_FILE = Path(__file__).resolve().parents[1] / "data" / "calibration.txt"


def check_vector_type(name: Any, option: str = "vector type") -> str:
    """``name`` as one of :data:`VECTOR_TYPES` (``float32`` is ``float``); InvalidInput naming the
    choices, with a did-you-mean, otherwise. ``option`` is how the message names the setting."""
    text = name if isinstance(name, str) else None
    if text == "float32":
        return "float"
    if text in VECTOR_TYPES:
        return text
    choices = VECTOR_TYPES if option == "vector type" else ("float32", "float", *VECTOR_TYPES[1:])
    raise InvalidInput(with_hint(f"{option} must be one of {', '.join(choices)}, got {shown(name)}", name, choices))


def width_of(vector_type: str, dim: int) -> int:
    """How many values a row of ``vector_type`` holds for ``dim`` dimensions (bytes for the packed types)."""
    return (dim + 7) // 8 if check_vector_type(vector_type) in PACKED else dim


def calibration_ranges(vectors: np.ndarray) -> np.ndarray:
    """``(2, dim)`` float32: each dimension's minimum (row 0) and maximum (row 1) over the rows of ``vectors``."""
    rows = np.asarray(vectors, dtype=np.float32)
    if rows.ndim != 2 or rows.shape[0] == 0:
        raise InvalidInput(f"ranges are measured on a (rows, dim) array of at least one row, got shape {rows.shape}")
    return np.stack([rows.min(axis=0), rows.max(axis=0)]).astype(np.float32)


def quantize(vectors: np.ndarray, vector_type: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """``vectors`` (float, one row or ``(n, dim)``) as ``vector_type`` rows (see the module docstring).

    ``ranges`` (``(2, dim)``: mins, then maxes) is needed for int8 and uint8 and ignored otherwise:
    an embedder's own are `Embedder.vector_ranges`. Ranges measured on the batch being quantized
    would make rows of two calls incomparable, so none are guessed."""
    kind = check_vector_type(vector_type)
    values = np.asarray(vectors)
    if values.dtype.kind != "f":
        raise InvalidInput(f"quantize takes float vectors, got dtype {values.dtype}")
    values = values.astype(np.float32, copy=False)
    if kind == "float":
        return values
    if kind in PACKED:
        packed = np.packbits(values > 0, axis=-1)
        return (packed.astype(np.int16) - 128).astype(np.int8) if kind == "binary" else packed
    if ranges is None:
        raise InvalidInput(f"{kind} needs the per-dimension ranges ((2, dim): mins, maxes); an embedder's own are "
                           "Embedder.vector_ranges()")
    bounds = np.asarray(ranges, dtype=np.float32)
    dim = values.shape[-1] if values.ndim else 0
    if bounds.shape != (2, dim) or not np.isfinite(bounds).all():
        raise InvalidInput(f"{kind} ranges must be a finite (2, {dim}) array (mins, maxes), got shape {bounds.shape}")
    starts = bounds[0]
    steps = (bounds[1] - starts) / np.float32(255)
    steps = np.where(steps == 0, np.float32(1), steps)
    levels = np.clip(np.floor((values - starts) / steps), 0, 255)
    return levels.astype(np.uint8) if kind == "uint8" else (levels - 128).astype(np.int8)


def unpack_binary(packed: np.ndarray, dim: int) -> np.ndarray:
    """Packed binary or ubinary rows back to float32 ``+1`` / ``-1`` per dimension (the padding bits
    dropped): what float rescoring takes the documents as."""
    raw = np.asarray(packed)
    raw = (raw.astype(np.int16) + 128).astype(np.uint8) if raw.dtype == np.int8 else raw.astype(np.uint8)
    bits = np.unpackbits(raw, axis=-1)[..., :dim]
    return bits.astype(np.float32) * 2 - 1


# -- an artifact's ranges ------------------------------------------------------------------------


def calibration_texts(count: int = RANGE_TEXTS) -> list[str]:
    """The first ``count`` distinct non-empty lines of the bundled calibration set (``kvembed/data/calibration.txt``)."""
    lines = CALIBRATION_FILE.read_text(encoding="utf-8").splitlines()
    return list(dict.fromkeys(line.strip() for line in lines if line.strip()))[:count]


def measure_ranges(embedder: Any, texts: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Graph output name (``embedding``, ``embedding.<label>``) -> the ``(2, dim)`` ranges of the
    normalised vectors ``embedder`` (an `Embedder`) computes for ``texts`` (default
    :func:`calibration_texts`) as each kind of its method (query and document prompts), every
    output in one pass per kind."""
    texts = calibration_texts() if texts is None else list(texts)
    names = [output_names(label)[0] for label in [None, *embedder.artifact.also]]
    rows: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for kind in embedder.method.templates:
        vectors = embedder.embed_outputs(embedder.encoder.encode(texts, kind), names)
        for name in names:
            rows[name].append(vectors[name])
    return {name: calibration_ranges(np.concatenate(parts)) for name, parts in rows.items()}


def ranges_record(ranges: Mapping[str, np.ndarray], texts: int) -> dict[str, dict[str, Any]]:
    """The manifest's ``vector_ranges``: output name -> ``{"min": [...], "max": [...], "texts": n}``,
    each end rounded to :data:`RANGE_DIGITS` significant digits."""
    def rounded(values: np.ndarray) -> list[float]:
        return [float(f"{float(x):.{RANGE_DIGITS}g}") for x in values]

    return {name: {"min": rounded(pair[0]), "max": rounded(pair[1]), "texts": int(texts)} for name, pair in ranges.items()}
