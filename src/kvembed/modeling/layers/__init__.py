"""Automatic layer selection by intrinsic dimension (kv-embedding ``layers="auto"``).

- :func:`twonn`: the TwoNN estimator (Facco et al. 2017); torch-free.
- :func:`select_layers`: the rule of METHODS.md: ``l*`` = argmin of the ID over layers
  ``>= floor(0.2 L)``, ``R = {l*, ..., min(L-1, l* + floor(0.1 L))}``; torch-free.
- :func:`layer_intrinsic_dimensions` / :func:`select_layers_for_model`: the per-layer ID of a
  model's final-token states on calibration texts (see :mod:`kvembed.modeling.layers.selection` for
  exactly which states), and the resulting :class:`LayerSelection`.
- :func:`compute_layer_selection`: the same from a model name; ``kvembed layers`` (alias
  ``kvembed-layers``) on the command line (:mod:`kvembed.cli.layers`).
"""

from .calibration import builtin_calibration_path, generate_calibration, load_calibration
from .estimate import DISCARD_FRACTION, MIN_POINTS, RULE, distinct_points, select_layers, twonn
from .report import plot_curve, write_json, write_report
from .selection import (
    PROMPTS,
    LayerSelection,
    compute_layer_selection,
    final_token_states,
    layer_intrinsic_dimensions,
    prompt_template,
    select_layers_for_model,
)

__all__ = [
    "DISCARD_FRACTION",
    "MIN_POINTS",
    "PROMPTS",
    "RULE",
    "LayerSelection",
    "builtin_calibration_path",
    "compute_layer_selection",
    "distinct_points",
    "final_token_states",
    "generate_calibration",
    "layer_intrinsic_dimensions",
    "load_calibration",
    "plot_curve",
    "prompt_template",
    "select_layers",
    "select_layers_for_model",
    "twonn",
    "write_json",
    "write_report",
]
