"""Triton ``config.pbtxt`` messages for one artifact: tokenizer, model, ensemble.

Every config is a ``tritonclient`` ``model_config_pb2.ModelConfig`` message written with protobuf
``text_format`` (and read back the same way), so field names and types are checked by Triton's
own schema rather than by hand-formatted strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from ..artifact import MODEL, Manifest
from ..artifact.engine import engine_limits
from ..errors import InvalidInput
from .options import ServingOptions

CONFIG = "config.pbtxt"
MAIN_OUTPUT = "embedding"
#: the graph inputs a tokenizer can produce, in the runtime's order
TOKEN_INPUTS = ("input_ids", "attention_mask", "pool_mask")
#: the shortest and a typical sequence length for TensorRT optimisation profiles
OPT_SEQUENCE = 128


@dataclass(frozen=True)
class ArtifactFacts:
    """What the configs need to know about one artifact (read from its manifest)."""

    name: str
    inputs: tuple[str, ...]
    #: graph output name -> (ensemble output name, width): ``embedding`` and ``embedding.<label>``
    outputs: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    #: tokens per text (the artifact's max_length, or less where an engine's profiles stop sooner)
    max_length: int = 512
    #: padded width of every tokenizer batch (an engine's shortest profile sequence; else 1)
    min_sequence: int = 1
    #: engine.json of an engine directory (kvembed build-engine), None for an ONNX artifact
    engine: Mapping[str, Any] | None = None
    #: the artifact's precision (a bf16 one runs on OpenVINO under the python backend's provider auto)
    precision: str = "fp32"

    @classmethod
    def from_manifest(
        cls, name: str, manifest: Manifest, engine: Mapping[str, Any] | None = None
    ) -> "ArtifactFacts":
        inputs = tuple(manifest.input_names)
        unknown = [item for item in inputs if item not in TOKEN_INPUTS]
        if unknown:
            raise InvalidInput(f"artifact inputs {unknown} are not token inputs ({', '.join(TOKEN_INPUTS)}); re-export it")
        outputs: dict[str, tuple[str, int]] = {}
        for item in manifest.outputs:
            graph_name = item.name
            head, _, label = graph_name.partition(".")
            if head != MAIN_OUTPUT:
                continue
            if label == MAIN_OUTPUT:
                raise InvalidInput(
                    f"the --also label {label!r} would collide with the ensemble's main output; re-export with another label"
                )
            outputs[graph_name] = (label or MAIN_OUTPUT, item.width)
        max_length, min_sequence = manifest.max_length, 1
        if engine is not None:
            limits = engine_limits(engine)
            max_length, min_sequence = min(max_length, limits.max_sequence), limits.min_sequence
        return cls(name=name, inputs=inputs, outputs=outputs, max_length=max_length, min_sequence=min_sequence, engine=engine,
                   precision=manifest.precision)

    def serving_options(self, options: "ServingOptions") -> "ServingOptions":
        """``options`` for this artifact: an engine's largest profile batch is every config's max batch."""
        if self.engine is None:
            return options
        top = engine_limits(self.engine).max_batch_size
        return replace(options, max_batch_size=top,
                       preferred_batch_sizes=tuple(size for size in options.preferred_batch_sizes if size <= top))

    @property
    def tokenize(self) -> str:
        return f"{self.name}_tokenize"

    @property
    def model(self) -> str:
        return f"{self.name}_model"


def _tensor(message: Any, name: str, dtype: int, dims: list[int], optional: bool = False, ragged: bool = False) -> None:
    tensor = message.add(name=name, data_type=dtype, dims=dims)
    if optional:
        tensor.optional = True
    if ragged:
        tensor.allow_ragged_batch = True


def _instances(config: mc.ModelConfig, count: int, gpu: bool, profiles: int = 0) -> None:
    """``count`` instances; a TensorRT model's may use each of its plan's ``profiles``."""
    group = config.instance_group.add(count=count, kind=mc.ModelInstanceGroup.KIND_GPU if gpu else mc.ModelInstanceGroup.KIND_CPU)
    group.profile.extend(str(index) for index in range(profiles))


def _parameters(config: mc.ModelConfig, values: Mapping[str, str]) -> None:
    for key, value in values.items():
        config.parameters[key].string_value = value


def tokenize_config(facts: ArtifactFacts, options: ServingOptions) -> mc.ModelConfig:
    """``<name>_tokenize``: python backend, TEXT (+ optional KIND) in, padded token tensors out.

    Dynamic batching lives here: TEXT has the fixed shape [1] per row, so Triton can merge any
    concurrent requests (it merges only requests of equal shape).
    """
    config = mc.ModelConfig(name=facts.tokenize, backend="python", max_batch_size=options.max_batch_size)
    _tensor(config.input, "TEXT", mc.TYPE_STRING, [1])
    if options.kind == "both":
        _tensor(config.input, "KIND", mc.TYPE_STRING, [1], optional=True)
    for name in facts.inputs:
        _tensor(config.output, name, mc.TYPE_INT64, [-1])
    config.dynamic_batching.max_queue_delay_microseconds = options.max_queue_delay_us
    config.dynamic_batching.preferred_batch_size.extend(options.preferred_batch_sizes)
    _instances(config, options.instances, gpu=False)
    _parameters(config, {"kind": options.kind, "padding": "request" if options.backend == "python" else "execution",
                         "max_length": str(facts.max_length), "min_length": str(facts.min_sequence)})
    if options.warmup:
        _warmup(config, options, {"TEXT": (mc.TYPE_STRING, [1], "text")})
    return config


def model_config(facts: ArtifactFacts, options: ServingOptions, sequence: int = 0) -> mc.ModelConfig:
    """``<name>_model``: the graph, on the chosen backend; -1 for the dynamic sequence dim.

    Its dynamic batcher (no added delay) merges whatever queues while an instance is busy: for
    the python backend requests of any width (ragged inputs; the model re-batches rows by length
    as ``Embedder.encode`` does, from per-request padding), for graph backends the equal-width
    requests one tokenizer execution emits. ``sequence`` is the token count of the warm-up sample.
    """
    config = mc.ModelConfig(name=facts.model, max_batch_size=options.max_batch_size)
    if options.backend == "python":
        config.backend = "python"
        _parameters(config, {"provider": options.provider, "threads": str(options.threads) if options.threads else "",
                             "batch_size": "32", "max_batch_tokens": str(options.max_batch_tokens or ""), "max_padding": ""})
    elif options.backend == "onnxruntime":
        config.platform = "onnxruntime_onnx"
        config.default_model_filename = MODEL
        if options.threads:
            _parameters(config, {"intra_op_thread_count": str(options.threads)})
        if options.tensorrt_accelerator:
            accelerator = config.optimization.execution_accelerators.gpu_execution_accelerator.add(name="tensorrt")
            accelerator.parameters["precision_mode"] = "FP16" if options.fp16 else "FP32"
            accelerator.parameters["max_workspace_size_bytes"] = str(1 << 30)
            accelerator.parameters["trt_engine_cache_enable"] = "1"
    else:
        config.platform = "tensorrt_plan"
        config.default_model_filename = "model.plan"
    for name in facts.inputs:  # python: requests of any width merge, the model re-batches rows
        _tensor(config.input, name, mc.TYPE_INT64, [-1], ragged=options.backend == "python")
    for graph_name, (_, width) in facts.outputs.items():
        _tensor(config.output, graph_name, mc.TYPE_FP32, [width])
    config.dynamic_batching.SetInParent()
    profiles = len(facts.engine["profiles"]) if facts.engine else 1
    _instances(config, options.instances, gpu=options.gpu, profiles=profiles if options.backend == "tensorrt" else 0)
    if options.warmup:
        _warmup(config, options, {name: (mc.TYPE_INT64, [max(sequence, 1)], name) for name in facts.inputs})
    return config


def ensemble_config(facts: ArtifactFacts, options: ServingOptions) -> mc.ModelConfig:
    """``<name>``: TEXT (+ KIND) -> ``embedding`` and every ``--also`` output under its label."""
    config = mc.ModelConfig(name=facts.name, platform="ensemble", max_batch_size=options.max_batch_size)
    _tensor(config.input, "TEXT", mc.TYPE_STRING, [1])
    if options.kind == "both":
        _tensor(config.input, "KIND", mc.TYPE_STRING, [1], optional=True)
    for exposed, width in facts.outputs.values():
        _tensor(config.output, exposed, mc.TYPE_FP32, [width])
    tokens = config.ensemble_scheduling.step.add(model_name=facts.tokenize, model_version=-1)
    tokens.input_map["TEXT"] = "TEXT"
    if options.kind == "both":
        tokens.input_map["KIND"] = "KIND"
    embed = config.ensemble_scheduling.step.add(model_name=facts.model, model_version=-1)
    for name in facts.inputs:
        tokens.output_map[name] = f"tokens.{name}"
        embed.input_map[name] = f"tokens.{name}"
    for graph_name, (exposed, _) in facts.outputs.items():
        embed.output_map[graph_name] = exposed
    return config


def _warmup(config: mc.ModelConfig, options: ServingOptions, inputs: Mapping[str, tuple[int, list[int], str]]) -> None:
    """One warm-up request of batch 1 and one of ``max_batch_size``, from files in ``warmup/``."""
    for batch in dict.fromkeys((1, options.max_batch_size)):
        warmup = config.model_warmup.add(name=f"batch_{batch}", batch_size=batch, count=1)
        for name, (dtype, dims, filename) in inputs.items():
            warmup.inputs[name].data_type = dtype
            warmup.inputs[name].dims.extend(dims)
            warmup.inputs[name].input_data_file = filename


def plan_shapes(facts: ArtifactFacts, options: ServingOptions) -> dict[str, tuple[str, str, str]]:
    """TensorRT optimisation profile (min, opt, max) per input, matching the config's batch limit
    and the artifact's max_length."""
    preferred = max(options.preferred_batch_sizes, default=max(1, options.max_batch_size // 2))
    sequence = min(OPT_SEQUENCE, facts.max_length)
    return {
        name: ("1x1", f"{preferred}x{sequence}", f"{options.max_batch_size}x{facts.max_length}") for name in facts.inputs
    }


def plan_build_command(facts: ArtifactFacts, options: ServingOptions, onnx: str, plan: str) -> str:
    """The ``trtexec`` command that builds ``model.plan`` on the target GPU with those shapes."""
    shapes = plan_shapes(facts, options)
    parts = ["trtexec", f"--onnx={onnx}", f"--saveEngine={plan}"]
    for index, flag in enumerate(("--minShapes", "--optShapes", "--maxShapes")):
        parts.append(flag + "=" + ",".join(f"{name}:{dims[index]}" for name, dims in shapes.items()))
    if options.fp16:
        parts.append("--fp16")
    return " ".join(parts)


def write_config(directory: Path, config: mc.ModelConfig) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CONFIG
    path.write_text(text_format.MessageToString(config), encoding="utf-8")
    return path


def read_config(path: str | Path) -> mc.ModelConfig:
    """Parse a ``config.pbtxt`` (a model directory or the file) into a ``ModelConfig``."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG
    return text_format.Parse(path.read_text(encoding="utf-8"), mc.ModelConfig())
