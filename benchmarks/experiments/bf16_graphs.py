"""Which bf16 graph keeps an fp16 artifact faithful on a CPU with BF16 and no FP16 (issue 62).

    python benchmarks/experiments/bf16_graphs.py --fp32 FP32_ART --fp16 FP16_ART

The head-to-head's client texts (16-64 tokens, cut mid-sentence: ``peers/head_to_head.py``), each
embedded by OpenVINO bf16 paths and compared with onnxruntime fp32 on the fp32 artifact: the fp32
artifact under the bf16 hint (the plugin picks which ops run bf16), the fp16 artifact as kvembed
runs it (:func:`~kvembed.backends.openvino_support.rewrites.write_bf16_graph`), and the fp16 graph
compiled by OpenVINO itself under the bf16 hint (its constants widened through f32 while
compiling). With ``--rounded DIR``, also the fp32 graph with some of its weights rounded ahead of
the plugin (written into DIR): the embedding table alone or every other weight, to bf16 directly or
through fp16, which says which rounding costs what. Worst and mean cosine, in batches of 16 sorted
by length, as ``Embedder.encode`` batches them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
from head_to_head import make_workloads  # noqa: E402


def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)


def openvino_own(graph: Path, texts: list[str], encoder, batch: int) -> np.ndarray:
    """The graph compiled by OpenVINO under the bf16 hint, fed as ``Embedder.encode`` feeds it."""
    import openvino as ov

    from kvembed.backends.openvino_support.rewrites import repeat_kv_heads

    core = ov.Core()
    model = core.read_model(str(graph))
    repeat_kv_heads(model)
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "bf16"})
    names = {port.get_any_name() for port in compiled.inputs}
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = None
    for start in range(0, len(texts), batch):
        rows = order[start:start + batch]
        feeds = encoder.pad(encoder.encode([texts[i] for i in rows], "document"), "right")
        got = compiled({k: v for k, v in feeds.items() if k in names})[compiled.outputs[0]]
        out = np.zeros((len(texts), got.shape[1]), np.float32) if out is None else out
        out[rows] = got
    return out


def rounded(fp32: Path, folder: Path, which: str, through_fp16: bool) -> Path:
    """The fp32 graph with its weights of more than 1,000 values (``which``: the embedding table,
    the one with the vocabulary's rows, or every other) rounded to bf16 (through fp16 first when
    ``through_fp16``), stored as fp32, written as ``folder``/model.onnx."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    bf16 = helper.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16)
    model = onnx.load(str(fp32 / "model.onnx"))
    vocab = max(t.dims[0] for t in model.graph.initializer if len(t.dims) == 2)
    for tensor in model.graph.initializer:
        if tensor.data_type != TensorProto.FLOAT or np.prod(tensor.dims) <= 1000:
            continue
        if (which == "embedding") != (tensor.dims[0] == vocab):
            continue
        values = numpy_helper.to_array(tensor)
        values = (values.astype(np.float16) if through_fp16 else values).astype(bf16).astype(np.float32)
        tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    return folder / "model.onnx"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fp32", type=Path, required=True)
    parser.add_argument("--fp16", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounded", type=Path, help="also the fp32 graph with weights rounded ahead of the plugin, written here")
    args = parser.parse_args()
    for artifact in (args.fp32, args.fp16):
        if not (artifact / "kvembed.json").is_file():
            parser.error(f"{artifact} is not a kvembed artifact (no kvembed.json)")
    from kvembed import OpenVINOOptions
    from kvembed.runtime import Embedder

    texts = make_workloads(args.fp32 / "tokenizer.json").clients
    reference = Embedder.load(args.fp32, provider="cpu")
    want = reference.encode(texts, batch_size=args.batch)
    bf16 = OpenVINOOptions(precision="bf16")
    paths = {
        "fp32 artifact, OpenVINO bf16 hint": Embedder.load(args.fp32, provider="openvino", options=bf16).encode(texts, batch_size=args.batch),
        "fp16 artifact, kvembed's bf16 graph": Embedder.load(args.fp16, provider="openvino", options=bf16).encode(texts, batch_size=args.batch),
        "fp16 artifact, OpenVINO's own bf16 compile": openvino_own(args.fp16 / "model.onnx", texts, reference.encoder, args.batch),
    }
    for which in ("embedding", "rest") if args.rounded else ():
        for through in (False, True):
            name = f"{which}-{'fp16-' if through else ''}bf16"
            graph = rounded(args.fp32, args.rounded / name, which, through)
            label = f"fp32 graph, {'the embedding table' if which == 'embedding' else 'every other weight'} rounded to bf16{' through fp16' if through else ''}"
            paths[label] = openvino_own(graph, texts, reference.encoder, args.batch)
    print(f"{len(texts)} client texts, batches of {args.batch}, cosine against onnxruntime fp32:")
    for name, got in paths.items():
        found = cosines(got, want)
        print(f"  {name}: worst {found.min():.5f}, mean {found.mean():.5f}, below 0.999: {int((found < 0.999).sum())}")


if __name__ == "__main__":
    main()
