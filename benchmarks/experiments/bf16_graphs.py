"""Which bf16 graph keeps an fp16 artifact faithful on a CPU with BF16 and no FP16 (issue 62).

    python benchmarks/experiments/bf16_graphs.py --fp32 FP32_ART --fp16 FP16_ART

The head-to-head's client texts (16-64 tokens, cut mid-sentence: ``peers/head_to_head.py``), each
embedded by three OpenVINO bf16 paths and compared with onnxruntime fp32 on the fp32 artifact:
the fp32 artifact under the bf16 hint (the plugin picks which ops run bf16), the fp16 artifact as
kvembed runs it (its graph retyped to bf16: weights and activations), and the fp16 graph compiled
by OpenVINO itself under the bf16 hint (its constants widened through f32 while compiling). Worst
and mean cosine, in batches of 16 sorted by length, as ``Embedder.encode`` batches them.
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


def openvino_own(artifact: Path, texts: list[str], encoder, batch: int) -> np.ndarray:
    """The fp16 graph compiled by OpenVINO under the bf16 hint, fed as ``Embedder.encode`` feeds it."""
    import openvino as ov

    from kvembed.backends.openvino_support.rewrites import repeat_kv_heads

    core = ov.Core()
    model = core.read_model(str(artifact / "model.onnx"))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fp32", type=Path, required=True)
    parser.add_argument("--fp16", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=16)
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
        "fp16 artifact, kvembed's bf16 graph (retyped)": Embedder.load(args.fp16, provider="openvino", options=bf16).encode(texts, batch_size=args.batch),
        "fp16 artifact, OpenVINO's own bf16 compile": openvino_own(args.fp16, texts, reference.encoder, args.batch),
    }
    print(f"{len(texts)} client texts, batches of {args.batch}, cosine against onnxruntime fp32:")
    for name, got in paths.items():
        found = cosines(got, want)
        print(f"  {name}: worst {found.min():.5f}, mean {found.mean():.5f}, below 0.999: {int((found < 0.999).sum())}")


if __name__ == "__main__":
    main()
