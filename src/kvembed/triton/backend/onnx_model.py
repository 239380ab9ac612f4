"""Triton python-backend model ``<name>_model``: token inputs -> embeddings, with the kvembed runtime.

Runs the artifact's ``model.onnx`` (in ``artifact/`` beside this file, checked against its
manifest's sha256 at load) through the kvembed runtime copied beside it (``kvembed/``). The rows
of every request the dynamic batcher merged (its inputs allow ragged batches, so requests of any
width merge) go through the runtime's batching loop, ``Embedder.embed_outputs``, as
``Embedder.encode``'s do: sorted by length, at most ``batch_size`` rows and ``max_batch_tokens``
padded tokens per batch, each batch run in graph calls within the runtime's per-call budget and
the backend's row limit. Results are split back so every caller gets its own rows.

Config parameters: ``provider`` (auto | cpu | cuda | tensorrt | openvino), ``threads``
(onnxruntime intra-op threads; empty = onnxruntime's default), ``batch_size`` (rows per batch),
``max_batch_tokens`` (padded tokens per batch; empty = the runtime's per-call budget),
``max_padding`` (the largest fraction of a row that may be padding, default
:data:`DEFAULT_MAX_PADDING`: one merge holds few rows of spread-out lengths, and padding them
costs CPU for nothing; benchmarks/log/triton.md).
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the copied kvembed runtime wins over any installed kvembed

import triton_python_backend_utils as pb_utils  # noqa: E402

import kvembed.version  # noqa: E402
from kvembed.runtime import Embedder  # noqa: E402
from kvembed.runtime.batching import BatchPolicy  # noqa: E402
from kvembed.triton.rows import split_rows, unpad_rows  # noqa: E402


#: rows of one merge whose padding would pass this fraction of the row go to another batch
DEFAULT_MAX_PADDING = 0.1


def _int(text, default):
    return int(text) if str(text).strip() else default


def batch_policy(parameters, config, embedder):
    """The model's :class:`BatchPolicy` from its config parameters: greedy cuts capped by
    ``max_padding`` (no call cost), the embedder's per-call budget."""
    tokens = _int(parameters.get("max_batch_tokens", ""), None)
    padding = str(parameters.get("max_padding", "")).strip()
    return BatchPolicy.from_options(
        embedder.policy,
        batch_size=_int(parameters.get("batch_size", ""), int(config.get("max_batch_size") or 32)),
        max_batch_tokens=tokens or embedder.max_call_tokens,
        call_cost=None,
        max_padding=float(padding) if padding else DEFAULT_MAX_PADDING,
    )


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self.embedder = Embedder.load(
            HERE / "artifact",
            provider=parameters.get("provider", "auto") or "auto",
            threads=_int(parameters.get("threads", ""), None),
        )
        self.policy = batch_policy(parameters, config, self.embedder)
        self.inputs = [tensor["name"] for tensor in config["input"]]
        self.outputs = [tensor["name"] for tensor in config["output"]]
        pb_utils.Logger.log_info(f"{args['model_name']}: kvembed runtime from {Path(kvembed.version.__file__).parent}")
        choice = self.embedder.choice
        pb_utils.Logger.log_info(f"{args['model_name']}: runs on {self.embedder.target} ({choice.reason if choice else ''}), "
                                 f"{self.policy}")

    def execute(self, requests):
        try:
            rows, counts = [], []
            for request in requests:
                feed = {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.inputs}
                request_rows = unpad_rows(feed)
                rows += request_rows
                counts.append(len(request_rows))
            results = self.embedder.embed_outputs(rows, self.outputs, policy=self.policy)
        except Exception as err:  # answer every request of this execution with the reason
            error = pb_utils.TritonError(f"{type(err).__name__}: {err}")
            return [pb_utils.InferenceResponse(output_tensors=[], error=error) for _ in requests]
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(name, part[name]) for name in self.outputs])
            for part in split_rows(results, counts)
        ]
