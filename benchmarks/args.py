"""argparse types shared by the scripts in ``benchmarks/`` (imported as ``args`` from the script's
folder): a wrong value is one line naming it."""

from __future__ import annotations

import argparse


def positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value
