"""Triton python-backend model ``<name>_model``: token inputs -> embeddings, with onnxruntime.

Runs the artifact's ``model.onnx`` (in ``artifact/`` beside this file, checked against its
manifest's sha256 at load) through the kvembed runtime copied beside it (``kvembed/``). Requests
the dynamic batcher merged are stacked into one padded batch, run once, and split back, so every
caller gets its own rows. Config parameters: ``provider`` (auto | cpu | cuda | tensorrt) and
``threads`` (onnxruntime intra-op threads; empty = onnxruntime's default).
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
from kvembed.runtime.session import run_session  # noqa: E402
from kvembed.triton.rows import split_rows, stack_requests  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        threads = parameters.get("threads", "").strip()
        self.embedder = Embedder.load(
            HERE / "artifact", provider=parameters.get("provider", "auto") or "auto", threads=int(threads) if threads else None
        )
        self.inputs = [tensor["name"] for tensor in config["input"]]
        self.outputs = [tensor["name"] for tensor in config["output"]]
        self.pad_values = {"input_ids": self.embedder.encoder.pad_id}
        pb_utils.Logger.log_info(f"{args['model_name']}: kvembed runtime from {Path(kvembed.__file__).parent}")

    def execute(self, requests):
        try:
            feeds = [{name: pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in self.inputs} for r in requests]
            batch, counts = stack_requests(feeds, self.pad_values, self.embedder.padding_side)
            if sum(counts) == 0:
                results = [self._empty(name) for name in self.outputs]
            else:
                results = run_session(self.embedder.session, batch, self.outputs)
        except Exception as err:  # answer every request of this execution with the reason
            error = pb_utils.TritonError(f"{type(err).__name__}: {err}")
            return [pb_utils.InferenceResponse(output_tensors=[], error=error) for _ in requests]
        per_request = split_rows(dict(zip(self.outputs, results)), counts)
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(name, rows[name]) for name in self.outputs])
            for rows in per_request
        ]

    def _empty(self, name):
        label = None if name == "embedding" else name.split(".", 1)[1]
        return np.zeros((0, self.embedder.dim_of(label)), dtype=np.float32)
