"""Shared numerical checks of the test suite: METHODS.md's "the same", written out literally.

One cosine helper and one comparison for every test that compares embeddings, so a test never
takes its limits from the code under test (``kvembed.export.TOLERANCES`` is itself checked
against these numbers in test_artifacts.py).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

#: METHODS.md, "What the same means": worst-row cosine per precision ...
MIN_COSINE = {"fp32": 0.99999, "fp16": 0.999, "int8": 0.99}
#: ... and, for fp32, the max abs difference on normalised vectors
MAX_ABS_FP32 = 1e-4


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine in float64."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def assert_same(got: np.ndarray, want: np.ndarray, precision: str = "fp32", what: str = "") -> None:
    """``got`` equals ``want`` by METHODS.md's tolerances for ``precision`` (fp32: cosine and max abs)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.isfinite(got).all(), f"{what}: non-finite values"
    worst = float(cosines(got, want).min())
    assert worst >= MIN_COSINE[precision], f"{what}: worst cosine {worst} < {MIN_COSINE[precision]} ({precision})"
    if precision == "fp32":
        diff = float(np.abs(got.astype(np.float64) - want).max())
        assert diff <= MAX_ABS_FP32, f"{what}: max abs difference {diff} > {MAX_ABS_FP32}"


def oracle_rows(oracle: Any, method: str, texts: Sequence[str], kind: str = "document", **options: Any) -> np.ndarray:
    """The independent oracle's embedding of each text, stacked (options passed verbatim)."""
    return np.stack([oracle.embed(method, text, kind, **options) for text in texts])


def assert_matches_oracle(
    encode: Callable[[Sequence[str], str], np.ndarray],
    oracle: Any,
    method: str,
    texts: Sequence[str],
    precision: str = "fp32",
    kinds: Sequence[str] = ("document", "query"),
    what: str = "",
    **options: Any,
) -> None:
    """``encode(texts, kind)`` against the oracle for each kind."""
    for kind in kinds:
        want = oracle_rows(oracle, method, texts, kind, **options)
        assert_same(encode(texts, kind), want, precision, f"{what} {method} {options} ({kind})")


#: prepended to a script by :func:`run_without_torch`: importing torch or transformers raises
_BLOCK_TORCH = """
import sys

class _Block:
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError("blocked: " + name)

sys.meta_path.insert(0, _Block())
"""
_NO_TORCH_LOADED = """
assert not [m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")]
"""


def run_python(script: str, cwd: Any = None, timeout: float = 120) -> Any:
    """Run ``script`` in a fresh interpreter (``python -c``); returns the CompletedProcess with
    text stdout/stderr. For what only a new process shows: imports, exit-time behaviour."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def run_without_torch(body: str, cwd: Any = None, timeout: float = 120) -> Any:
    """Run the Python ``body`` in a fresh interpreter where importing torch or transformers fails,
    and check afterwards that neither got loaded; returns the CompletedProcess."""
    import textwrap

    return run_python(_BLOCK_TORCH + textwrap.dedent(body) + _NO_TORCH_LOADED, cwd=cwd, timeout=timeout)
