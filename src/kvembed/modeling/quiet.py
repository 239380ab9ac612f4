"""Quiet transformers while kvembed loads a model: its load report, warnings and progress bars
are expected noise there (an unused ``lm_head``, a dequantization), not news for the user.

A module of its own so that GGUF dequantization, model loading and Causal2Vec's loaders share it
without importing one another.
"""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' load report, warnings and progress bars for the duration of the block."""
    from transformers.utils import logging as hf_logging

    previous, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)
        if bars:
            hf_logging.enable_progress_bar()
