"""kvembed.export: patched Hugging Face decoders -> portable ONNX embedding artifacts.

``export(model, method, out, precision="fp32", **options)`` traces the PyTorch reference
(:class:`kvembed.modeling.reference.TorchEmbedder`) to ONNX, converts it to the requested precision,
checks it against the reference (the parity gate) and writes ``out/`` with ``model.onnx``,
``tokenizer.json`` and the ``kvembed.json`` manifest. ``verify(out)`` re-runs the gate later.

Reading artifacts back is the torch-free runtime's job (:class:`kvembed.runtime.Embedder`); the
manifest schema is :mod:`kvembed.artifact`'s. Exporting needs the ``export`` extra.
"""

from ..artifact import MANIFEST, SCHEMA_VERSION, check_files, read_manifest
from .graph.trace import ExportError
from .graph.ops import ALLOWED_OPS, TENSORRT_OPS, non_portable_ops, op_types
from .gate.parity import GATE_TEXTS, HELD_OUT_TEXTS, PARITY_TEXTS, TOLERANCES, ParityReport
from .precision.convert import PRECISIONS


#: the torch-dependent pipeline's names, and the module each loads from on first use
_LAZY = {
    **dict.fromkeys(("export", "export_result", "Exporter", "ExportResult", "ParityError", "OutputExistsError",
                     "load_embedder"), "core"),
    **dict.fromkeys(("verify", "VerifyResult"), "gate.verification"),
    "STAGES": "progress",
}


def __getattr__(name: str):  # the torch-dependent pipeline loads on first use
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ALLOWED_OPS",
    "MANIFEST",
    "GATE_TEXTS",
    "HELD_OUT_TEXTS",
    "PARITY_TEXTS",
    "PRECISIONS",
    "SCHEMA_VERSION",
    "STAGES",
    "TENSORRT_OPS",
    "TOLERANCES",
    "ExportError",
    "ExportResult",
    "Exporter",
    "OutputExistsError",
    "ParityError",
    "ParityReport",
    "VerifyResult",
    "check_files",
    "export",
    "export_result",
    "load_embedder",
    "non_portable_ops",
    "op_types",
    "read_manifest",
    "verify",
]
