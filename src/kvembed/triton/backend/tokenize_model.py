"""Triton python-backend model ``<name>_tokenize``: TEXT (+ KIND) -> the graph's padded token inputs.

Tokenisation is kvembed's own ``TextEncoder`` (prompt template, clean-up, truncation, query vs
document, ``<PST>``), loaded from the artifact files in ``artifact/`` beside this file, with the
kvembed runtime copied beside it too (``kvembed/``), so the repository needs no kvembed install.
Bad input fails only the request that sent it, with a message naming the row and the status of
a caller's mistake (INVALID_ARG: HTTP 400, gRPC INVALID_ARGUMENT; the ensemble passes the code on);
any other failure is the server's (INTERNAL: 500).
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the copied kvembed runtime wins over any installed kvembed

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

import kvembed.version  # noqa: E402
from kvembed.artifact import load_manifest  # noqa: E402
from kvembed.runtime.artifact import encoder_from_manifest  # noqa: E402
from kvembed.triton.rows import decode_strings, encode_rows, is_client_error, parse_kinds  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        artifact = HERE / "artifact"
        manifest = load_manifest(artifact)
        self.encoder = encoder_from_manifest(artifact, manifest)
        # a TensorRT plan takes sequences only within its profiles: cut to, and pad to, their range
        self.encoder.cap_input_tokens(int(parameters.get("max_length") or self.encoder.max_length))
        self.encoder.pad_at_least(int(parameters.get("min_length") or 1))
        kind = parameters.get("kind", "both")
        self.fixed_kind = None if kind == "both" else kind
        # "request": each request padded to its own longest row (the python-backend graph model
        # re-batches rows itself, so no padding is wasted); "execution": every request of an
        # execution padded to one width, so Triton can merge them for a graph backend that needs
        # equal shapes (onnxruntime, TensorRT)
        self.per_request = parameters.get("padding", "execution") == "request"
        self.outputs = [output["name"] for output in config["output"]]
        pb_utils.Logger.log_info(f"{args['model_name']}: kvembed runtime from {Path(kvembed.version.__file__).parent}")

    def execute(self, requests):
        encoded = [self._encode(request) for request in requests]
        rows = [item for result in encoded if isinstance(result, list) for item in result]
        shared = self.encoder.pad(rows) if rows and not self.per_request else None
        responses, start = [], 0
        for result in encoded:
            if not isinstance(result, list):
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=result))
                continue
            stop = start + len(result)
            if shared is not None:
                batch = {name: shared[name][start:stop] for name in self.outputs}
            elif result:
                batch = self.encoder.pad(result)
            else:  # an empty request (Triton normally refuses those before the model)
                batch = {name: np.zeros((0, 1), dtype=np.int64) for name in self.outputs}
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, batch[n]) for n in self.outputs]))
            start = stop
        return responses

    def _encode(self, request):
        """This request's encoded rows, or the TritonError to answer it with."""
        try:
            texts = decode_strings(pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy(), "TEXT")
            kind_tensor = pb_utils.get_input_tensor_by_name(request, "KIND")
            kinds = None if kind_tensor is None else decode_strings(kind_tensor.as_numpy(), "KIND")
            return encode_rows(self.encoder, texts, parse_kinds(kinds, len(texts), self.fixed_kind))
        except Exception as err:  # any failure answers this request only; the others go on
            return _error(err)


def _error(err):
    """``err`` as a TritonError: INVALID_ARG (400) for the caller's mistakes, INTERNAL (500) otherwise."""
    code = pb_utils.TritonError.INVALID_ARG if is_client_error(err) else pb_utils.TritonError.INTERNAL
    return pb_utils.TritonError(f"{type(err).__name__}: {err}", code)
