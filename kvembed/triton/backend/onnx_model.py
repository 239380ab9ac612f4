"""Triton python-backend model ``<name>_model``: token inputs -> embeddings, with onnxruntime.

Runs the artifact's ``model.onnx`` (in ``artifact/`` beside this file, checked against its
manifest's sha256 at load) through the kvembed runtime copied beside it (``kvembed/``). The rows
of every request the dynamic batcher merged (its inputs allow ragged batches, so requests of any
width merge) are re-batched exactly as ``Embedder.encode`` batches: sorted by length, at most
``batch_size`` rows and ``max_tokens`` padded tokens per graph call. Results are split back so
every caller gets its own rows. Config parameters: ``provider`` (auto | cpu | cuda | tensorrt | openvino),
``threads`` (onnxruntime intra-op threads; empty = onnxruntime's default), ``batch_size``,
``max_tokens`` (empty = the runtime's call budget), ``max_padding`` (the largest fraction of a
row that may be padding, default 0.1: one merge holds few rows of spread-out lengths, and padded
4,096-token calls cost 1.48x the CPU per text of unpadded ones; benchmarks/RESULTS.md).
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the copied kvembed runtime wins over any installed kvembed

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

import kvembed  # noqa: E402
from kvembed.runtime import Embedder  # noqa: E402
from kvembed.runtime.batching import plan_batches  # noqa: E402
from kvembed.triton.rows import split_rows, unpad_rows  # noqa: E402


#: rows of one merge whose padding would pass this fraction of the row go to another graph call
DEFAULT_MAX_PADDING = 0.1


def _int(text, default):
    return int(text) if str(text).strip() else default


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self.embedder = Embedder.load(
            HERE / "artifact",
            provider=parameters.get("provider", "auto") or "auto",
            threads=_int(parameters.get("threads", ""), None),
        )
        self.batch_size = _int(parameters.get("batch_size", ""), int(config.get("max_batch_size") or 32))
        # padded tokens per graph call: the config's max_tokens, else the runtime's own call budget
        # (Embedder.max_call_tokens: 2,048 on CPU, none on GPUs)
        self.max_tokens = _int(parameters.get("max_tokens", ""), None) or self.embedder.max_call_tokens
        padding = str(parameters.get("max_padding", "")).strip()
        self.max_padding = float(padding) if padding else DEFAULT_MAX_PADDING
        self.inputs = [tensor["name"] for tensor in config["input"]]
        self.outputs = {tensor["name"]: int(tensor["dims"][-1]) for tensor in config["output"]}
        pb_utils.Logger.log_info(f"{args['model_name']}: kvembed runtime from {Path(kvembed.__file__).parent}")
        pb_utils.Logger.log_info(f"{args['model_name']}: providers {self.embedder.providers}, max_tokens {self.max_tokens}, "
                                 f"max_padding {self.max_padding}")

    def execute(self, requests):
        try:
            rows, counts = [], []
            for request in requests:
                feed = {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.inputs}
                request_rows = unpad_rows(feed)
                rows += request_rows
                counts.append(len(request_rows))
            results = {name: np.zeros((len(rows), width), dtype=np.float32) for name, width in self.outputs.items()}
            encoder, names = self.embedder.encoder, list(self.outputs)
            for chunk in plan_batches([len(row.ids) for row in rows], self.batch_size, self.max_tokens, self.max_padding):
                batch = encoder.pad([rows[i] for i in chunk], self.embedder.padding_side)
                for name, array in zip(names, self.embedder.session.run(batch, names)):
                    results[name][chunk] = array
        except Exception as err:  # answer every request of this execution with the reason
            error = pb_utils.TritonError(f"{type(err).__name__}: {err}")
            return [pb_utils.InferenceResponse(output_tensors=[], error=error) for _ in requests]
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(name, rows[name]) for name in names])
            for rows in split_rows(results, counts)
        ]
