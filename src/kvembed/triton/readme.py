"""The README.md written into every generated repository: what is in it, how to serve and query it."""

from __future__ import annotations

from typing import Sequence

from ..version import __version__
from ..artifact.engine import describe_profiles
from .configs import ArtifactFacts, plan_build_command
from .options import ServingOptions

TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"  # Triton 2.51, the release kvembed tests against


def repository_readme(models: Sequence[ArtifactFacts], options: ServingOptions) -> str:
    first = models[0]
    kind_input = options.kind == "both"
    rows = "\n".join(
        f"| `{m.name}` | `{m.tokenize}` | `{m.model}` | {', '.join(f'`{name}` [{width}]' for name, width in m.outputs.values())} |"
        for m in models
    )
    backend = {
        "python": (
            "python backend running the artifact's `model.onnx` with OpenVINO's CPU plugin (`--provider openvino`)"
            if options.provider == "openvino"
            else "python backend running the artifact's `model.onnx` with onnxruntime (CPU, or CUDA with onnxruntime-gpu)"
        ),
        "onnxruntime": "Triton's onnxruntime backend (`platform: onnxruntime_onnx`)"
        + (f", TensorRT accelerator ({'FP16' if options.fp16 else 'FP32'})" if options.tensorrt_accelerator else ""),
        "tensorrt": "Triton's TensorRT backend (`platform: tensorrt_plan`); where the plan comes from: below",
    }[options.backend]
    kind_text = (
        "`KIND` (optional BYTES, `[batch, 1]`: `query` or `document`, default `document`) selects the prompt."
        if kind_input
        else f"Every text is embedded as a {options.kind} (built with `--kind {options.kind}`; there is no `KIND` input)."
    )
    kind_json = ', {"name": "KIND", "shape": [1, 1], "datatype": "BYTES", "data": ["query"]}' if kind_input else ""
    kind_py = (
        '\nkind = httpclient.InferInput("KIND", [2, 1], "BYTES")\n'
        'kind.set_data_from_numpy(np.array([[b"query"], [b"query"]], dtype=object))\ninputs.append(kind)'
        if kind_input
        else ""
    )
    # provider auto runs a certified bf16 artifact on OpenVINO where the CPU has BF16 (onnxruntime without the package)
    openvino = options.provider == "openvino" or (options.provider == "auto" and any(m.precision == "bf16" for m in models))
    packages = '"numpy<2" onnxruntime tokenizers' + (" openvino" if openvino else "")
    gpu = ""
    if options.backend != "python":
        gpu = (
            "\n## GPU variant\n\n"
            f"`*_model` uses {backend}. It needs Triton's NGC container ({TRITON_IMAGE} or newer) on a GPU host: "
            "the onnxruntime and TensorRT backends are not in pip-installed Triton builds, and kvembed's own tests "
            "do not exercise these variants (they only check that the configs parse and that Triton accepts them).\n"
        )
        if options.backend == "tensorrt":
            gpu += _plans_section(models, options)
    return f"""# Triton model repository (kvembed {__version__})

Written by `kvembed triton build`. Query the ensemble; the other two models are its steps.

| ensemble (query this) | tokenizer (python backend) | graph | outputs (FP32) |
|---|---|---|---|
{rows}

- `*_tokenize`: kvembed's `TextEncoder` (prompt template, clean-up, truncation, query vs document
  prompt), exactly as `kvembed.runtime.Embedder` tokenises; dynamic batching (max batch
  {options.max_batch_size}{"; an engine directory's: its largest profile batch" if any(m.engine for m in models) else ""}, queue delay {options.max_queue_delay_us} us) merges concurrent requests here.
- `*_model`: {backend}.
- Input `TEXT`: BYTES (UTF-8), shape `[batch, 1]`. {kind_text}
  Invalid UTF-8 (or a bad `KIND`) fails that request with a message and HTTP 400 (gRPC `INVALID_ARGUMENT`);
  other requests are unaffected. A fault of the server itself is a 500 (`INTERNAL`).
- Outputs: `embedding` (L2-normalised) and one tensor per `--also` method of the artifact, named by its label.

## Python environment

The python-backend models import the kvembed runtime copied into their version directory
(`1/kvembed/`, with the artifact files in `1/artifact/`), so kvembed need not be installed where
Triton runs. Triton's python environment (the `python3` first on `PATH` when `tritonserver` starts;
inside the NGC container, its system python) needs the runtime's packages:

```bash
pip install {packages}   # onnxruntime-gpu for CUDA
```

Keep numpy's major version the one Triton's python backend stub was built against (numpy 1 for
Triton 2.51 / 24.10 and pytriton 0.7's bundled server; with numpy 2 such a stub garbles BYTES inputs).

## Start Triton

```bash
docker run --rm -p 8000:8000 -p 8001:8001 -p 8002:8002 -v "$PWD":/models {TRITON_IMAGE} \\
  sh -c 'pip install {packages} && tritonserver --model-repository=/models'
# or, without docker, Triton from the nvidia-pytriton wheel (python backend only); it listens on
# 127.0.0.1 only (HTTP 8000, gRPC 8001, metrics 8002) unless given --host 0.0.0.0:
kvembed triton serve .
```

## Query

```bash
curl -s localhost:8000/v2/models/{first.name}/infer -H 'Content-Type: application/json' -d '{{
  "inputs": [{{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["A cat sat on the mat."]}}{kind_json}],
  "outputs": [{{"name": "embedding"}}]}}'
```

```python
import numpy as np
import tritonclient.http as httpclient   # tritonclient.grpc has the same API on port 8001

client = httpclient.InferenceServerClient("localhost:8000")
text = httpclient.InferInput("TEXT", [2, 1], "BYTES")
text.set_data_from_numpy(np.array([["what is a cat?".encode()], ["a dog".encode()]], dtype=object))
inputs = [text]{kind_py}
vectors = client.infer("{first.name}", inputs).as_numpy("embedding")   # float32 [2, dim]
```
{gpu}"""


def _plans_section(models: Sequence[ArtifactFacts], options: ServingOptions) -> str:
    """Where each ``1/model.plan`` comes from: an engine directory's plan (copied in), or the build
    script to run on the serving GPU."""
    text = "\nTensorRT engines are specific to a GPU and a TensorRT version.\n"
    engines = [m for m in models if m.engine is not None]
    if engines:
        text += "\nCopied from `kvembed build-engine` engine directories (serve them with a Triton whose TensorRT is " \
                "exactly this version, on this GPU model; otherwise rebuild the engine there):\n\n"
        for m in engines:
            e = m.engine or {}
            limits = describe_profiles(e)
            text += (f"- `{m.model}/1/model.plan`: TensorRT {e['tensorrt_version']}, {e['gpu']['name']} (compute "
                     f"capability {e['gpu']['compute_capability']}), {e['precision']}, profiles {limits}; the configs' "
                     f"max batch is the largest profile batch and `{m.tokenize}` cuts texts to {m.max_length} tokens "
                     f"and pads batches to at least {m.min_sequence}.\n")
    built = [m for m in models if m.engine is None]
    if built:
        text += (
            "\nBuild `1/model.plan` on the serving host before starting Triton (the shapes match the config's "
            "`max_batch_size` and the artifact's max_length):\n\n```bash\n"
            + "\n".join(f"sh {m.model}/build_plan.sh   # {plan_build_command(m, options, 'onnx/model.onnx', '1/model.plan')}" for m in built)
            + "\n```\n"
        )
    return text
