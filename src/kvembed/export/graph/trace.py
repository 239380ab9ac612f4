"""Tracing the patched model into an ONNX graph (fp32), in one of two attention forms.

We trace with ``torch.onnx.export(..., dynamo=True)``: ``torch.export`` runs the module's Python
(forward hooks, the ``kvembed_prefix`` kwarg, the attention function registered with
transformers) and records only tensor operations, with symbolic batch and sequence sizes; a
shape-dependent Python branch becomes a guard (an error at export time) instead of a silently
baked-in constant. The legacy TorchScript exporter also traces every method to ~1e-6, but turns
each ``squeeze`` of a dynamic dimension into an ``If`` node (not allowed in the portable graph),
and is deprecated upstream.

Attention comes out in one of two forms (``attention=``): ``"decomposed"`` (opset 18: MatMul ->
Add(mask) -> Softmax -> MatMul, with an Expand repeating K/V for grouped-query attention) or
``"fused"`` (opset 23: one standard ``Attention`` node per layer, GQA inside the op). The fused form
needs no rewrite: torch.onnx's opset-23 translation of ``scaled_dot_product_attention`` emits
``Attention`` by itself; we only make transformers call SDPA with ``enable_gqa=True`` instead of
repeating K/V first (its ``TRANSFORMERS_SDPA_FORCE_GQA`` switch, set for the trace only), and run
onnxscript's optimizer without its opset-23 fusions, so that ``Attention`` is the only op the fused
graph adds. RMSNormalization is not needed (onnxruntime fuses the decomposed RMSNorm at load).
RotaryEmbedding was tried (onnxscript's rule fuses every query and key rotation) and left out: it
gained no speed, OpenVINO runs such a graph wrongly even after kvembed's mend of its grouped-query
fault, and TensorRT parses it only from 10.15.1 (benchmarks/log/goals-and-profile.md, "RotaryEmbedding").
The manifest's minimum TensorRT version is the newest any op in the graph needs
(``TENSORRT_OPS_SINCE``).

A family that soft-caps its attention logits (Gemma 2) runs eager attention, not SDPA (which has
no cap), so its graph is decomposed whichever form was asked: the manifest records the form the
graph has, and why.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CheckFailed, InvalidInput
from ...artifact.external_data import EXTERNAL_MIN_BYTES
from .ops import STANDARD_DOMAINS, TENSORRT_OPS_SINCE, version_key

MIN_OPSET = 18
#: the first opset with the standard ``Attention`` operator
FUSED_OPSET = 23
ATTENTION_FORMS = ("fused", "decomposed")
#: the oldest onnxruntime that runs the fused graph: its CPU Attention(23) kernel shipped in 1.23
#: (microsoft/onnxruntime#25156; its GQA fix #26057 in 1.23.1). The decomposed graph needs nothing
#: past opset 18.
FUSED_MIN_ONNXRUNTIME = "1.23.1"
DECOMPOSED_MIN_ONNXRUNTIME = "1.14"
#: the minimum TensorRT recorded for a graph of long-supported ops only (what decomposed graphs said before)
BASE_MIN_TENSORRT = "8.6"
INPUTS = ("input_ids", "attention_mask", "pool_mask", "encoder_input_ids", "encoder_attention_mask")
#: Causal2Vec's context encoder inputs, with a sequence axis of their own
ENCODER_INPUTS = ("encoder_input_ids", "encoder_attention_mask")
BATCH, SEQUENCE, ENCODER_SEQUENCE = "batch", "sequence", "encoder_sequence"

#: Texts of the trace example: two rows of different lengths, so the example is padded.
TRACE_TEXTS = ("A short example.", "A somewhat longer example sentence, traced with symbolic sizes.")


class ExportError(CheckFailed, RuntimeError):
    """The model could not be turned into a valid graph (not a user error)."""


def input_names(embedder: Any) -> list[str]:
    names = ["input_ids", "attention_mask"]
    if embedder.model.uses_pool_mask:
        names.append("pool_mask")
    if embedder.model.uses_context:
        names.extend(ENCODER_INPUTS)
    return names


def input_axes(name: str) -> tuple[str, str]:
    """The symbolic (batch, sequence) axes of graph input ``name``."""
    return (BATCH, ENCODER_SEQUENCE if name in ENCODER_INPUTS else SEQUENCE)


def output_names(embedder: Any) -> list[str]:
    """``embedding``, ``pooled``, then ``embedding.<label>``, ``pooled.<label>`` per extra method."""
    from ...methods.sharing import output_names as names_of

    return [name for label, _ in embedder.model.readouts for name in names_of(label)]


def check_attention(attention: str, opset: int | None) -> int:
    """The opset for ``attention`` (``opset`` if given and compatible); ValueError naming the fix."""
    if attention not in ATTENTION_FORMS:
        raise InvalidInput(f"attention must be one of {', '.join(ATTENTION_FORMS)}, got {attention!r}")
    if opset is None:
        return FUSED_OPSET if attention == "fused" else MIN_OPSET
    if isinstance(opset, bool) or not isinstance(opset, int):
        raise TypeError(f"opset must be an int, got {opset!r}")
    if opset < MIN_OPSET:
        raise InvalidInput(f"opset {opset} is too old: the exporter needs opset >= {MIN_OPSET}")
    if attention == "fused" and opset < FUSED_OPSET:
        raise InvalidInput(f"--attention fused needs opset >= {FUSED_OPSET} (the Attention operator); "
                         f"got {opset}: raise --opset or use --attention decomposed")
    if attention == "decomposed" and opset >= FUSED_OPSET:
        raise InvalidInput(f"--attention decomposed needs opset < {FUSED_OPSET} (from {FUSED_OPSET} on, torch.onnx "
                         f"emits the Attention operator); got {opset}: use --opset {MIN_OPSET}")
    return opset


def resolve_attention(attention: str | None, opset: int | None) -> tuple[str, int]:
    """``(form, opset)`` for an export: an unset ``attention`` follows an explicit ``opset`` (below
    23: decomposed, else fused), or else :func:`default_attention`; then :func:`check_attention`."""
    if attention is None:
        if opset is None:
            attention = default_attention()
        else:
            low = isinstance(opset, int) and not isinstance(opset, bool) and opset < FUSED_OPSET
            attention = "decomposed" if low else "fused"
    return attention, check_attention(attention, opset)


def default_attention() -> str:
    """``"fused"`` where the installed onnxruntime runs opset-23 ``Attention`` on CPU, else ``"decomposed"``."""
    return "fused" if runtime_runs_fused() else "decomposed"


@functools.lru_cache(maxsize=1)
def runtime_runs_fused() -> bool:
    """Whether this onnxruntime runs a grouped-query ``Attention`` (opset 23) with an additive mask
    and K/V longer than Q: a 1-node probe, since a version number says nothing about a custom build."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    float4 = ["b", "h", "s", "d"]
    graph = helper.make_graph(
        [helper.make_node("Attention", ["q", "k", "v", "m"], ["y"])], "probe",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, float4) for n in ("q", "k", "v", "m")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, float4)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", FUSED_OPSET)], ir_version=10)
    q, kv = np.ones((1, 4, 2, 8), np.float32), np.ones((1, 2, 3, 8), np.float32)
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        out = session.run(None, {"q": q, "k": kv, "v": kv, "m": np.zeros((1, 1, 2, 3), np.float32)})[0]
    except Exception:  # no kernel, or one without GQA / masks
        return False
    return out.shape == (1, 4, 2, 8) and bool(np.allclose(out, 1.0))


@contextlib.contextmanager
def _gqa_in_sdpa(enabled: bool):
    """Make transformers' SDPA path pass ``enable_gqa=True`` instead of repeating K/V (trace only)."""
    key = "TRANSFORMERS_SDPA_FORCE_GQA"
    before = os.environ.get(key)
    if enabled:
        os.environ[key] = "1"
    try:
        yield
    finally:
        if enabled:
            if before is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = before


def trace(
    embedder: Any, path: Path, opset: int | None = None, quiet: bool = True, attention: str = "decomposed"
) -> dict[str, Any]:
    """Trace ``embedder.model`` to ``path`` (fp32); return facts about the graph for the manifest.

    The saved graph has int64 inputs ``input_ids``, ``attention_mask`` (and ``pool_mask`` for
    echo) with symbolic ``batch`` and ``sequence`` axes, and float32 outputs ``embedding`` and
    ``pooled`` of shape ``[batch, dim]`` (and a pair per ``also`` method). ``attention`` picks
    the form of attention (module docstring); ``opset`` defaults to the form's.
    """
    import torch

    opset = check_attention(attention, opset)
    names, outputs = input_names(embedder), output_names(embedder)
    with warnings.catch_warnings():  # a small max_length truncates the example: harmless here
        warnings.simplefilter("ignore")
        example = embedder.encoder.pad(embedder.encoder.encode(list(TRACE_TEXTS), "document"), "right")
    args = tuple(torch.from_numpy(example[name]) for name in names)
    dynamic = {name: dict(enumerate(input_axes(name))) for name in names}
    model = embedder.model
    out = io.StringIO()
    redirect = (contextlib.redirect_stdout(out), contextlib.redirect_stderr(out)) if quiet else ()
    try:
        with contextlib.ExitStack() as stack:
            for ctx in redirect:
                stack.enter_context(ctx)
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore")
            if quiet:  # "torchvision is not installed" notices from the op registry
                stack.enter_context(_logger_level("torch.onnx", logging.ERROR))
            stack.enter_context(torch.no_grad())
            stack.enter_context(model.patched())
            stack.enter_context(_gqa_in_sdpa(attention == "fused"))
            program = torch.onnx.export(
                model,
                args,
                None,
                input_names=names,
                output_names=outputs,
                dynamic_shapes=dynamic,
                opset_version=opset,
                dynamo=True,
                optimize=False,  # below: the optimizer without the opset-23 fusions
                verbose=False,
            )
            if program is not None:
                import onnxscript.optimizer

                # a weight's Transpose stays a node here: folding it would copy every weight while
                # the PyTorch model still holds the originals; _transpose_lazily writes it transposed
                onnxscript.optimizer.optimize_ir(program.model, should_fold=_keep_weight_transposes)
    except ValueError:
        raise
    except Exception as err:  # torch.export / translation failures: report what broke
        detail = str(err).strip().splitlines()
        raise ExportError(
            f"torch.onnx.export (dynamo) could not trace method {embedder.method.name!r}: "
            f"{type(err).__name__}: {detail[0] if detail else ''}"
        ) from err
    if program is None:
        raise ExportError("torch.onnx.export returned no program")
    _fix_names(program.model.graph, outputs)
    _check_io(program.model.graph, names, outputs)
    attention_facts = _check_attention_form(program.model.graph, attention, opset, _runs_eager(model))
    transposed = _transpose_lazily(program.model.graph)
    path.parent.mkdir(parents=True, exist_ok=True)
    weights = _initializer_bytes(program.model.graph)
    _save_program(program, path)
    _forget_weights(program.model.graph)
    return {
        "exporter": "torch.onnx.export(dynamo=True)",
        "opset": opset,
        "weights_transposed_on_write": transposed,
        "weights_bytes": int(weights),
        "attention": attention_facts,
        "optimizations": ["onnxscript.optimizer.optimize_ir: constant folding, dead-code elimination, "
                          "common-subexpression elimination (no opset-23 fusions)"],
    }


def _runs_eager(model: Any) -> bool:
    """Whether ``model``'s attention runs eager, which no attention op fuses: a soft cap on its logits."""
    architecture, decoder = getattr(model, "architecture", None), getattr(model, "decoder", None)
    return bool(getattr(architecture, "softcapped", False)
                and getattr(getattr(decoder, "config", None), "attn_logit_softcapping", None) is not None)


def _check_attention_form(graph: Any, attention: str, opset: int, eager: bool = False) -> dict[str, Any]:
    """Check the traced graph has the asked form: fused means every attention is one ``Attention``
    node fed K/V with the key/value heads (no Expand); decomposed means none. An ``eager`` model's
    graph is decomposed at any opset (:func:`_runs_eager`), and its facts say so."""
    producers = {value.name: node for node in graph for value in node.outputs}
    fused = [node for node in graph if node.op_type == "Attention" and node.domain in STANDARD_DOMAINS]
    softmax = sum(1 for node in graph if node.op_type == "Softmax")
    why = {}
    if eager:  # the graph is decomposed whatever was asked: checked and recorded as such
        attention, why = "decomposed", {"why": "soft-capped attention logits: eager attention, which no attention operator fuses"}
    if attention == "fused":
        # no attention at all is fine: an early exit that reads only layer 0's values runs none
        if softmax:
            raise ExportError(f"the fused trace has {len(fused)} Attention and {softmax} Softmax nodes: "
                              "this torch.onnx did not translate scaled_dot_product_attention to Attention")
        for node in fused:
            for value in list(node.inputs)[1:3]:
                if _fed_by_expand(value, producers):
                    raise ExportError(
                        "the fused graph repeats K/V for grouped-query attention (Expand before Attention): "
                        "this transformers ignores TRANSFORMERS_SDPA_FORCE_GQA; use --attention decomposed"
                    )
    elif fused:
        raise ExportError(f"the decomposed trace has {len(fused)} Attention nodes")
    return {"form": attention, "attention_nodes": len(fused), **why,
            "min_versions": {"onnxruntime": FUSED_MIN_ONNXRUNTIME if opset >= FUSED_OPSET else DECOMPOSED_MIN_ONNXRUNTIME,
                             "tensorrt": min_tensorrt({node.op_type for node in graph if node.domain in STANDARD_DOMAINS})}}


def min_tensorrt(op_types: set[str]) -> str:
    """The oldest TensorRT whose ONNX parser takes every op in ``op_types`` (``TENSORRT_OPS_SINCE``)."""
    needed = [TENSORRT_OPS_SINCE[op] for op in op_types if op in TENSORRT_OPS_SINCE] + [BASE_MIN_TENSORRT]
    return max(needed, key=version_key)


def _fed_by_expand(value: Any, producers: dict[str, Any], depth: int = 3) -> bool:
    """Whether ``value`` comes from an Expand through at most ``depth`` Reshape/Concat steps."""
    node = producers.get(value.name) if value is not None else None
    if node is None or depth == 0:
        return False
    if node.op_type == "Expand":
        return True
    if node.op_type in ("Reshape", "Concat", "Unsqueeze"):
        return any(_fed_by_expand(v, producers, depth - 1) for v in node.inputs)
    return False


@contextlib.contextmanager
def _logger_level(name: str, level: int):
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


def _fix_names(graph: Any, names: list[str]) -> None:
    """Make the output names (``embedding``, ``pooled``, ...) name only the graph outputs.

    The dynamo exporter names values after FX nodes, so the token-embedding lookup's output is
    also called ``embedding``: a duplicate definition that makes the model invalid.
    """
    outputs = list(graph.outputs)
    for node in graph:
        for value in node.outputs:
            if value.name in names and not any(value is out for out in outputs):
                value.name = f"{value.name}__internal"
    for value, name in zip(outputs, names):
        value.name = name


def _check_io(graph: Any, names: list[str], outputs: list[str]) -> None:
    got_in = [v.name for v in graph.inputs]
    got_out = [v.name for v in graph.outputs]
    if got_in != names or got_out != outputs:
        raise ExportError(f"unexpected graph signature: inputs {got_in}, outputs {got_out}")
    for value in graph.inputs:
        dims = list(value.shape) if value.shape is not None else []
        if len(dims) != 2 or any(isinstance(d, int) for d in dims):
            raise ExportError(
                f"input {value.name} lost its dynamic axes during export (shape {dims}); a branch "
                "in the model specialised the batch or sequence size"
            )


def _initializer_bytes(graph: Any) -> int:
    total = 0
    for value in graph.initializers.values():
        if value.const_value is not None:
            total += int(value.const_value.nbytes)
    return total


def _is_weight_transpose(node: Any) -> bool:
    """A standard Transpose whose only input is a weight (an initializer larger than a few KB)
    read by nothing else."""
    if node.op_type != "Transpose" or node.domain not in STANDARD_DOMAINS or not node.inputs:
        return False
    source = node.inputs[0]
    return (source is not None and source.is_initializer() and source.const_value is not None
            and source.const_value.nbytes >= EXTERNAL_MIN_BYTES and len(source.consumers()) == 1)


def _keep_weight_transposes(node: Any) -> bool | None:
    """``optimize_ir``'s ``should_fold``: never fold a weight's Transpose (default rules otherwise)."""
    return False if _is_weight_transpose(node) else None


def _transpose_lazily(graph: Any) -> int:
    """Replace every ``Transpose(weight)`` by an initializer holding the transposed weight, computed
    only when the graph is written (``onnx_ir.LazyTensor``), one tensor at a time: the graph stores
    weights as MatMul's B as before, and no second copy of the weights is ever held in memory."""
    import onnx_ir as ir

    count = 0
    for node in [n for n in graph if _is_weight_transpose(n)]:
        source, result = node.inputs[0], node.outputs[0]
        tensor = source.const_value
        perm = node.attributes["perm"].as_ints() if "perm" in node.attributes else list(range(len(tensor.shape)))[::-1]
        shape = ir.Shape([tensor.shape[p] for p in perm])
        lazy = ir.LazyTensor(functools.partial(_transposed, tensor, tuple(perm)), dtype=tensor.dtype, shape=shape,
                             name=result.name)
        value = ir.Value(name=result.name, shape=shape, type=ir.TensorType(tensor.dtype), const_value=lazy)
        result.name = f"{result.name}__transpose"
        result.replace_all_uses_with(value)
        graph.remove(node, safe=True)
        graph.initializers.pop(source.name)
        source.const_value = None  # the lazy tensor holds the weight now; a stale Value must not
        graph.register_initializer(value)
        count += 1
    return count


def _transposed(tensor: Any, perm: tuple[int, ...]) -> Any:
    """``tensor`` transposed by ``perm``, as a contiguous ``onnx_ir.Tensor``.

    torch's copy of a permuted view is blocked for the caches and runs on every core: ~3x numpy's
    ``ascontiguousarray`` of a transposed weight, the same bytes (a dtype torch lacks takes numpy's)."""
    import onnx_ir as ir
    import torch

    array = tensor.numpy()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a read-only array: torch only reads it here
            moved = torch.from_numpy(array)
    except TypeError:
        return ir.Tensor(np.ascontiguousarray(np.transpose(array, perm)))
    return ir.Tensor(moved.permute(*perm).contiguous().numpy())


def _forget_weights(graph: Any) -> None:
    """Drop the in-memory graph's references to the weights once they are written: they are the
    PyTorch model's own tensors, and onnxscript's module-level rewrite rules keep the last graph
    they matched alive (SimplePatternMatcher._graph), which would keep the weights with it."""
    for value in graph.initializers.values():
        value.const_value = None


def _save_program(program: Any, path: Path) -> None:
    """Write the traced graph with its weights as external data, one tensor at a time: holding a
    ModelProto with every weight in it (and its serialised bytes) would cost two copies more."""
    import onnx_ir as ir

    ir.save(program.model, path, external_data=path.name + ".data", size_threshold_bytes=EXTERNAL_MIN_BYTES,
            max_workers=1)
