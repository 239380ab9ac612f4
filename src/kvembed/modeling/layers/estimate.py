"""The TwoNN intrinsic-dimension estimator and the kv-embedding ``auto`` layer rule. Torch-free.

TwoNN (Facco, d'Errico, Rodriguez & Laio, Sci. Rep. 7, 12140, 2017): for every point take the
ratio ``mu = r2 / r1`` of the distances to its second and first nearest neighbours. On a
``d``-dimensional manifold with locally uniform density, ``mu`` is Pareto distributed with
``F(mu) = 1 - mu**-d``, so ``-log(1 - F(mu)) = d * log(mu)``: a line through the origin whose
slope is the dimension. The slope is fitted by least squares on the empirical distribution
``F_i = i / N`` of the sorted ratios, after discarding the 10% largest ratios (the authors'
default; the tail is dominated by outliers and sparse regions).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ...errors import InvalidInput
from ...extras import install_hint

#: fewest distinct points :func:`twonn` accepts (the paper used 1,000 texts)
MIN_POINTS = 20
#: fraction of the largest ratios left out of the fit (Facco et al. 2017)
DISCARD_FRACTION = 0.1
#: points closer than this times the data's RMS norm count as the same point (float32 round-off
#: across batch shapes measured ~1e-6 relative on the test models)
DUPLICATE_RTOL = 1e-5

#: the selection rule of METHODS.md (kv-embedding, 4. ``auto``), as recorded in reports
RULE = "l* = argmin ID(l) over l >= floor(0.2 L) (first minimum wins); R = {l*, ..., min(L-1, l* + floor(0.1 L))}"


def _cKDTree():
    try:
        from scipy.spatial import cKDTree
    except ImportError as err:  # pragma: no cover - scipy comes with the export extra
        raise ImportError(f"intrinsic-dimension estimation needs scipy: {install_hint('export')} ({err})") from err
    return cKDTree


def distinct_points(points: np.ndarray, rtol: float = DUPLICATE_RTOL) -> np.ndarray:
    """``points`` without duplicates: of every group of points within ``rtol * RMS norm`` of
    each other, the first one is kept.

    TwoNN divides by the first-neighbour distance, so a repeated point (zero distance) would
    give an infinite ratio, and a near-repeat (distance at float round-off level, e.g. the same
    text run in two differently shaped batches) an arbitrarily large one. Facco et al. remove
    such points; so do we, with a tolerance relative to the data's scale so that float32
    round-off counts as "the same" while any genuine difference does not.
    """
    x = np.asarray(points, dtype=np.float64)
    x = np.unique(x, axis=0) if len(x) else x  # exact repeats (sorted order; TwoNN is order-free)
    scale = float(np.sqrt(np.mean(np.sum(x * x, axis=1)))) if len(x) else 0.0
    tol = rtol * scale
    if tol > 0 and len(x) > 1:
        pairs = _cKDTree()(x).query_pairs(tol, output_type="ndarray")
        if len(pairs):
            drop: set[int] = set()
            for i, j in sorted(map(tuple, pairs.tolist())):
                if i not in drop:  # i stays (or already went for an earlier twin); its twin j goes
                    drop.add(j)
            x = np.delete(x, sorted(drop), axis=0)
    return x


def twonn(points: np.ndarray, discard_fraction: float = DISCARD_FRACTION) -> float:
    """The TwoNN intrinsic dimension of ``points`` (``n x D``, one point per row).

    Duplicate and near-duplicate points are removed first (:func:`distinct_points`); at least
    :data:`MIN_POINTS` distinct points must remain, else ``ValueError``. Nearest neighbours come
    from ``scipy.spatial.cKDTree`` (exact, Euclidean).
    """
    x = np.asarray(points)
    if x.ndim != 2:
        raise InvalidInput(f"points must be a 2-D array (one point per row), got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.number) or not np.all(np.isfinite(x)):
        raise InvalidInput("points must be finite numbers (found NaN, inf or a non-numeric dtype)")
    if not 0.0 <= discard_fraction < 1.0:
        raise InvalidInput(f"discard_fraction must be in [0, 1), got {discard_fraction}")
    x = distinct_points(x)
    n = len(x)
    if n < MIN_POINTS:
        raise InvalidInput(f"TwoNN needs at least {MIN_POINTS} distinct points, got {n}")
    distances, _ = _cKDTree()(x).query(x, k=3)  # column 0 is the point itself
    mu = np.sort(distances[:, 2] / distances[:, 1])
    keep = int(n * (1.0 - discard_fraction))
    log_mu = np.log(mu[:keep])
    y = -np.log1p(-np.arange(1, keep + 1) / n)
    denominator = float(log_mu @ log_mu)
    if denominator <= 0.0:
        raise InvalidInput("TwoNN is undefined here: every point's two nearest neighbours are equidistant")
    return float(log_mu @ y) / denominator


def select_layers(ids: Sequence[float], num_layers: int) -> list[int]:
    """The kv-embedding ``auto`` re-routing set for a per-layer intrinsic-dimension curve.

    ``ids[l]`` is the ID after decoder layer ``l`` (``0 .. num_layers-1``). Layers before
    ``floor(0.2 L)`` are ignored (surface features); ``l*`` is the first argmin of the rest;
    the set is ``l* .. min(L-1, l* + floor(0.1 L))``. Non-finite values (a layer whose ID could
    not be estimated) never win.
    """
    L = int(num_layers)
    if L < 1:
        raise InvalidInput(f"num_layers must be >= 1, got {num_layers}")
    values = np.asarray(ids, dtype=np.float64)
    if values.shape != (L,):
        raise InvalidInput(f"need one intrinsic dimension per layer: {L} values, got {values.size}")
    start = math.floor(0.2 * L)
    candidates = np.where(np.isfinite(values[start:]), values[start:], np.inf)
    if not np.isfinite(candidates).any():
        raise InvalidInput(f"no finite intrinsic dimension among layers {start}..{L - 1}; cannot select layers")
    l_star = start + int(np.argmin(candidates))
    return list(range(l_star, min(L - 1, l_star + math.floor(0.1 * L)) + 1))
