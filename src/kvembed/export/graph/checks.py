"""Checks of a converted graph before the parity gate: portable operators only (int8 aside),
the decoder layers whose weights it holds equal to what the method needs, and onnx's checker.

Layers are counted from the weights, not the initializer names: the exporter renames transposed
weights and de-duplicates identical tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...artifact.external_data import DATA_FILE
from .trace import ExportError
from .ops import ALLOWED_OPS, non_portable_ops, op_types

#: weight matrices per decoder layer in the Llama layout: q, k, v, o, gate, up, down projections
MATRICES_PER_LAYER = 7


def weight_matmuls(model: Any) -> int:
    """How many (quantized) matrix multiplications in ``model`` take a weight initializer, directly
    or dequantised (weight-only int8)."""
    matrices = {t.name for t in model.graph.initializer if len(t.dims) == 2}
    matrices |= {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in matrices}
    count = 0
    for node in model.graph.node:
        if node.op_type in ("MatMul", "MatMulInteger", "Gemm") and len(node.input) > 1 and node.input[1] in matrices:
            count += 1
    return count


def decoder_layers_in_graph(model: Any, other_matmuls: int = 0, per_layer: int = MATRICES_PER_LAYER) -> int:
    """Decoder layers whose weights the graph holds: ``ceil(weight matmuls / per_layer)``, not
    counting ``other_matmuls`` that belong to something else (Causal2Vec's encoder and projector);
    ``per_layer`` is the architecture's :attr:`~kvembed.methods.architectures.Architecture.weight_matrices`.

    Every layer but the last contributes all its projections; the last may contribute fewer, as the
    exporter drops what the readout does not use (``va`` keeps only the last layer's ``v_proj``).
    Counting weights rather than reading initializer names: the exporter renames transposed
    weights and de-duplicates identical tensors (e.g. the all-ones norm weights of a fresh model).
    """
    return -(-(weight_matmuls(model) - other_matmuls) // per_layer)



def context_matmuls(embedder: Any) -> int:
    """Weight matrix products of Causal2Vec's encoder and projector (one per ``nn.Linear``)."""
    from torch import nn

    encoder = embedder.model.context_encoder
    return 0 if encoder is None else sum(isinstance(m, nn.Linear) for m in encoder.modules())


def check_graph(model_path: Path, precision: str, embedder: Any) -> dict[str, Any]:
    """Check the graph at ``model_path`` for ``embedder``'s method; the facts the manifest records."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    counts = op_types(model)
    bad = non_portable_ops(model, ALLOWED_OPS)
    if bad and precision != "int8":
        raise ExportError(
            f"the {precision} graph contains operators outside the portable allow-list: {', '.join(bad)}"
        )
    layers = decoder_layers_in_graph(model, context_matmuls(embedder), embedder.model.architecture.weight_matrices)
    needed = embedder.model.layers_needed
    if layers != needed:
        raise ExportError(f"the graph holds the weights of {layers} decoder layers, the method needs {needed}")
    onnx.checker.check_model(str(model_path), full_check=False)
    return {
        "op_types": dict(sorted(counts.items())),
        "nodes": len(model.graph.node),
        "decoder_layers": int(layers),
        "weight_matmuls": weight_matmuls(model),
        # int8 graphs are for CPUs: engines are built from fp32 or fp16 (kvembed.export.engine)
        "tensorrt_ready": not bad and precision != "int8",
        "non_portable_ops": bad,
        "external_data": (model_path.parent / DATA_FILE).exists(),
    }
