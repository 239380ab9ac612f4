"""How a Triton repository serves each artifact: the ``kvembed triton build`` options, checked once.

Free of tritonclient, so the command line reads these fields (default, type and help: see
:mod:`kvembed.flagfields`) without the triton extra.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..backends.targets import PROVIDER_HELP, check_provider
from ..errors import InvalidInput, shown, with_hint
from ..flagfields import flag
from ..runtime.batching import CPU_CALL_TOKENS

BACKENDS = ("python", "onnxruntime", "tensorrt")
KIND_CHOICES = ("query", "document", "both")


def parse_sizes(text: str) -> tuple[int, ...]:
    """``--preferred-batch-sizes``: comma-separated integers (empty: none)."""
    try:
        return tuple(int(item) for item in text.split(",") if item.strip())
    except ValueError:
        raise InvalidInput(f"--preferred-batch-sizes takes comma-separated integers, got {text!r}") from None


@dataclass(frozen=True)
class ServingOptions:
    """How the repository serves each artifact; each field is the ``kvembed triton build`` option of
    its name (the command line's options are generated from these fields)."""

    backend: str = flag("python", "Graph backend: python (onnxruntime in the python backend), onnxruntime, tensorrt.")
    max_batch_size: int = flag(64, "Rows per model execution.")
    instances: int = flag(1, "Instances of each model (KIND_CPU for python, KIND_GPU otherwise).")
    max_queue_delay_us: int = flag(2000, "Dynamic batcher wait for more requests (tokenizer).")
    preferred_batch_sizes: tuple[int, ...] = flag("", "Comma-separated preferred batch sizes, e.g. 16,32.", parse=parse_sizes)
    kind: str = flag("both", "query, document, or both (adds an optional KIND input).")
    warmup: bool = flag(False, "Add model_warmup requests (batch 1 and max) to the tokenizer and the graph.")
    tensorrt_accelerator: bool = flag(False, "onnxruntime backend: run through its TensorRT execution accelerator.")
    fp16: bool = flag(False, "TensorRT precision FP16 (tensorrt backend, or --tensorrt-accelerator).")
    #: 1 by default: instances scale throughput, and several multi-threaded pools (plus the
    #: tokenizer stubs) on the same cores stall on their slowest thread (benchmarks/log/triton.md).
    threads: int = flag(1, "onnxruntime intra-op threads per model instance (python/onnxruntime backends; 0 = one per core).")
    provider: str = flag("auto", f"python backend: runtime provider ({PROVIDER_HELP}; openvino needs the package in "
                         "Triton's python env).")
    max_batch_tokens: int | None = flag(
        None, "python backend: padded tokens (rows x longest row) per batch of merged rows, run in graph calls of at most "
        f"the runtime's per-call budget (default: that budget, {CPU_CALL_TOKENS} on CPU, none on GPU).")


    def __post_init__(self) -> None:
        object.__setattr__(self, "preferred_batch_sizes", tuple(int(size) for size in self.preferred_batch_sizes))
        if self.backend not in BACKENDS:
            raise InvalidInput(with_hint(f"backend must be one of {', '.join(BACKENDS)}, got {shown(self.backend)}", self.backend, BACKENDS))
        if self.kind not in KIND_CHOICES:
            raise InvalidInput(f"kind must be one of {', '.join(KIND_CHOICES)}, got {self.kind!r}")
        if not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 0:
            raise InvalidInput(f"threads must be an integer >= 0 (0 = onnxruntime's default), got {self.threads!r}")
        for name in ("max_batch_size", "instances"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidInput(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.max_queue_delay_us, int) or self.max_queue_delay_us < 0:
            raise InvalidInput(f"max_queue_delay_us must be an integer >= 0, got {self.max_queue_delay_us!r}")
        bad = [size for size in self.preferred_batch_sizes if not 1 <= int(size) <= self.max_batch_size]
        if bad:
            raise InvalidInput(
                f"preferred batch sizes {bad} are outside 1..max_batch_size ({self.max_batch_size}); "
                "lower them or raise --max-batch-size"
            )
        if self.tensorrt_accelerator and self.backend != "onnxruntime":
            raise InvalidInput("--tensorrt-accelerator is an onnxruntime-backend option; add --backend onnxruntime")
        check_provider(self.provider)
        if self.provider != "auto" and self.backend != "python":
            raise InvalidInput(f"--provider {self.provider} is a python-backend option (the {self.backend} backend picks its own); "
                             "drop it or add --backend python")
        if self.max_batch_tokens is not None:
            if not isinstance(self.max_batch_tokens, int) or isinstance(self.max_batch_tokens, bool) or self.max_batch_tokens < 1:
                raise InvalidInput(f"max_batch_tokens must be a positive integer, got {self.max_batch_tokens!r}")
            if self.backend != "python":
                raise InvalidInput("--max-batch-tokens is a python-backend option (graph backends run what the tokenizer batched); add --backend python")
        if self.fp16 and self.backend == "python":
            raise InvalidInput("--fp16 applies to TensorRT (--backend tensorrt, or onnxruntime with --tensorrt-accelerator)")

    @property
    def gpu(self) -> bool:
        """onnxruntime / TensorRT model instances run on GPUs; python-backend ones on CPUs unless
        their provider is cuda or tensorrt."""
        return self.backend != "python" or self.provider in ("cuda", "tensorrt")
