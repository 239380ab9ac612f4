"""Unit rows: the one L2 normalisation the runtime and its protocols apply to vectors outside a graph
(an fp16-arithmetic backend's output, MTEB's similarity, a Matryoshka prefix)."""

from __future__ import annotations

from typing import Any

import numpy as np


def unit_rows(rows: Any) -> np.ndarray:
    """``rows`` (one vector or several) scaled to unit L2 norm in float32, as 2-D rows (a zero row stays zero)."""
    array = np.atleast_2d(np.asarray(rows, dtype=np.float32))
    norms = np.linalg.norm(array, axis=-1, keepdims=True)
    return array / np.maximum(norms, np.finfo(np.float32).tiny)
