"""One export's request, checked once where it enters: ``kvembed export`` (before torch loads),
:func:`~kvembed.export.core.export` / :func:`~kvembed.export.core.export_result`, and
:meth:`~kvembed.export.core.Exporter.write` for a model already loaded. The pipeline's steps take
the :class:`ExportRequest` as given and never check its values again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from ..artifact.staging import check_output
from .gate.certify import check_gate_here
from .graph.trace import resolve_attention
from .precision.convert import check_int8_recipe, check_precision

@dataclass(frozen=True)
class ExportRequest:
    """What one export asks for, every value checked and resolved (build it with :meth:`checked`)."""

    #: the artifact directory to create (empty, or replaced with ``force``)
    out: Path
    #: one of :data:`~kvembed.export.precision.convert.PRECISIONS`
    precision: str = "fp32"
    force: bool = False
    #: int8: the recipes to try in turn (``--int8-recipe`` resolved for the opset); empty otherwise
    int8_recipes: tuple[str, ...] = ()
    #: bf16 on a CPU without BF16: gate it as it runs there (f32) instead of refusing
    certify_emulated: bool = False
    #: the attention form and ONNX opset of the trace, resolved together
    attention: str = "fused"
    opset: int = 23
    #: the model (folder, alias or hub id) and method a whole export loads; None for a model already
    #: loaded (an :class:`~kvembed.export.core.Exporter`'s own)
    model: Any = None
    method: str = "kv-embedding"
    max_length: int | None = None
    padding_side: str = "right"
    optimize: bool = True
    check_memory: bool = True
    #: the method's options (``layers``, ``also``, ...), as given: the method checks them as it loads
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    #: method options of a second reference the gate compares against instead (tests of the gate)
    reference_options: Mapping[str, Any] | None = None

    @classmethod
    def checked(
        cls,
        out: str | os.PathLike[str],
        precision: str = "fp32",
        *,
        force: bool = False,
        int8_recipe: str = "auto",
        certify_emulated: bool = False,
        attention: str | None = None,
        opset: int | None = None,
        model: Any = None,
        method: str = "kv-embedding",
        max_length: int | None = None,
        padding_side: str = "right",
        optimize: bool = True,
        check_memory: bool = True,
        reference_options: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> "ExportRequest":
        """The request, or a one-line error for the first bad value: the precision, the attention
        form and opset, the int8 recipes (for that opset), whether this machine can gate the
        precision, and the output directory. Cheap: nothing loads a model (the model, the method
        and its options are checked as they load)."""
        precision = check_precision(precision)
        attention, opset = resolve_attention(attention, opset)
        recipes = check_int8_recipe(int8_recipe, precision, opset)
        check_gate_here(precision, certify_emulated)
        return cls(
            out=check_output(out, force), precision=precision, force=force,
            int8_recipes=recipes if precision == "int8" else (), certify_emulated=certify_emulated,
            attention=attention, opset=opset, model=model, method=method, max_length=max_length,
            padding_side=padding_side, optimize=optimize, check_memory=check_memory,
            options=MappingProxyType(dict(options)),
            reference_options=None if reference_options is None else MappingProxyType(dict(reference_options)),
        )
