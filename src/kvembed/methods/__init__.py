"""Declarative method specs: one definition of every method, read by the patcher, the
exporter and the runtime. Torch-free."""

from .flags import flag_options
from .layers import format_layers, parse_layers
from .models import ALIASES, DEMO_MODEL, PRESETS, demo_model_path, resolve_model
from .registry import METHODS, get_method, resolve
from .spec import KINDS, PLACEHOLDER, MethodSpec, OptionSpec, ResolvedMethod

__all__ = [
    "ALIASES",
    "DEMO_MODEL",
    "KINDS",
    "METHODS",
    "PLACEHOLDER",
    "PRESETS",
    "MethodSpec",
    "OptionSpec",
    "ResolvedMethod",
    "demo_model_path",
    "flag_options",
    "format_layers",
    "get_method",
    "parse_layers",
    "resolve",
    "resolve_model",
]
