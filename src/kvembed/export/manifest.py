"""What an artifact's manifest says about its making: the source model
(:func:`~kvembed.export.source.source_record`), the method, the inputs and outputs, and the graph.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Mapping

from ..version import __version__
from ..methods.sharing import output_names
from ..artifact import ENCODER_TOKENIZER, SCHEMA_VERSION, Manifest
from .graph.trace import input_axes, input_names
from .source import source_record


def build_manifest(
    embedder: Any, traced: Mapping[str, Any], opset: int, precision: str, graph_facts: Mapping[str, Any],
    conversion: Mapping[str, Any], graphs: Mapping[str, str] | None = None,
) -> Manifest:
    """The typed manifest of ``embedder``'s graph for ``precision``, before its files and parity are
    known (the gate reads it; the exporter completes it once, :meth:`Manifest.updated`, and writes it).

    ``traced`` holds the trace's facts (exporter, attention form, optimizations); ``graph_facts``
    the checks' (:func:`~kvembed.export.graph.checks.check_graph`); ``conversion`` the precision's;
    ``graphs`` the graph file of a backend that does not run ``model.onnx`` (int8's OpenVINO graph)."""
    import onnx
    import onnxruntime
    import torch
    import transformers

    encoder = embedder.encoder
    names = input_names(embedder)
    model = embedder.model
    graph = {
        "exporter": traced["exporter"],
        # fused (one Attention op per layer, opset 23) or decomposed, and the oldest
        # onnxruntime / TensorRT that run this graph
        "attention": traced["attention"],
        "optimizations": traced["optimizations"],
        **graph_facts,
        "precision_conversion": dict(conversion),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
        },
    }
    return Manifest.from_dict({
        "schema_version": SCHEMA_VERSION,
        "kvembed_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "source": source_record(embedder),
        "method": embedder.method.to_dict(),
        # layers="auto": the intrinsic-dimension curve and the set it chose (else null)
        "layer_selection": getattr(embedder, "layer_selection", None),
        "dim": int(embedder.dim),
        "max_length": int(embedder.max_length),
        "opset": opset,
        "precision": precision,
        "padding_side": embedder.padding_side,
        "placeholder_id": encoder.placeholder_id,
        "pad_id": encoder.pad_id,
        "fallback_id": encoder.fallback_id,
        "inputs": [{"name": n, "dtype": "int64", "shape": list(input_axes(n))} for n in names],
        # Causal2Vec: the context encoder's tokenizer file, length limit and pad id (else null)
        "context_encoder": None if encoder.context_tokenizer is None else {
            "tokenizer": ENCODER_TOKENIZER, "max_length": encoder.context_max_length, "pad_id": encoder.context_pad_id,
        },
        # extra methods read from the same forward pass (--also): label -> method
        "also": {label: method.to_dict() for label, method in model.also.items()},
        "outputs": [
            {
                "name": name, "dtype": "float32", "shape": ["batch", model.readout_dim(method)],
                "normalized": normalized, "method": method.name if label is None else label,
            }
            for label, method in model.readouts
            for name, normalized in zip(output_names(label), (True, False))
        ],
        "graph": graph,
        "files": {},
        "parity": {},
        **({"graphs": dict(graphs)} if graphs else {}),
    })



def measured_ranges(directory: Any, manifest: Manifest) -> dict[str, Any]:
    """The manifest's ``vector_ranges``: the per-dimension ranges of every output's normalised vectors
    on the bundled calibration texts (:func:`~kvembed.runtime.quantize.measure_ranges`), computed by
    the graph in ``directory`` that ``manifest`` (its draft) describes, on the runtime's CPU provider."""
    from ..runtime import Embedder
    from ..runtime.quantize import calibration_texts, measure_ranges, ranges_record

    texts = calibration_texts()
    embedder = Embedder.load(Manifest.from_dict(manifest.to_dict(), directory=directory), provider="cpu", verify=False)
    return ranges_record(measure_ranges(embedder, texts), len(texts))
