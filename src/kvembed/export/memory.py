"""Refuse an export the machine cannot hold, before any weights load.

An export that runs out of memory is killed by the kernel minutes in, with no message. So
:func:`export_memory_check` estimates the export's peak from ``config.json`` (never the weights)
and the precision, compares it with what this process may still use (:func:`available_memory`)
and raises :class:`NotEnoughMemory` — saying what the export needs, what there is and what to
try — unless the caller opts out (``--skip-memory-check``, ``check_memory=False``).

The estimate is the largest of the pipeline's stages (:class:`Estimate`), each built from the
coefficients of :data:`COEFFICIENTS`. ``KVEMBED_MEMORY_LIMIT`` (``2GiB``, bytes, ...) pretends
the machine has only that much available: a way to rehearse a smaller machine's refusal.
Torch-free: it runs before torch imports in a fresh process.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..errors import InvalidInput, KvembedError
from ..methods.architectures import SUPPORTED
from ..sizes import parse_size

GIB = 1 << 30
#: "pretend this machine has only this much available" (bytes or a size like ``2GiB``)
LIMIT_ENV = "KVEMBED_MEMORY_LIMIT"
#: cgroup v1 reports "no limit" as a huge page-rounded number; anything above this is no bound
_UNLIMITED = 1 << 60
_SIXTEEN_BIT = {"bfloat16": 2, "float16": 2, "bf16": 2, "fp16": 2}


class NotEnoughMemory(KvembedError):
    """The export's estimated peak exceeds the memory available: exit 2 with what to try."""


class MemoryEstimateWarning(UserWarning):
    """No estimate could be made (an incomplete config.json): the export goes ahead unchecked."""


@dataclass(frozen=True)
class PeakCoefficients:
    """What each stage of the export holds, per parameter or per process; the lead tunes these
    from measurements (benchmarks/log/export-memory-4b.md keeps the figures, not this docstring).

    - ``reference_bytes_per_param``: the PyTorch reference is always fp32, because the parity gate
      compares every precision against fp32.
    - ``session_bytes_per_param``: precision -> (decoder-layer weight, token-embedding weight) bytes
      held by the gate's onnxruntime session. fp16 costs as much as fp32: onnxruntime's CPU
      provider has no fp16 MatMul on x86 and keeps fp32 copies of fp16 weights. int8 stores its
      token-embedding table int8 too (a scale per row, a few bytes beside each row of weights:
      :mod:`kvembed.export.precision.embedding_table`).
    - ``gguf_copies``: dequantizing a GGUF builds the fp32 model twice (transformers' loaded model,
      then the fresh model kvembed saves, see :func:`kvembed.modeling.gguf.materialize`).
    - ``activation_*``: a generous bound on the activations of the gate's largest batch (rows x
      tokens x (hidden x 6 + intermediate x 3) values).
    - ``process_base``: torch, onnxruntime and transformers imported.
    """

    reference_bytes_per_param: float = 4.0
    session_bytes_per_param: Mapping[str, tuple[float, float]] = field(
        default_factory=lambda: {"fp32": (4.0, 4.0), "fp16": (4.0, 4.0), "int8": (1.0, 1.0)}
    )
    gguf_copies: float = 2.0
    activation_rows: int = 12
    activation_tokens: int = 512
    activation_hidden_widths: int = 6
    activation_ffn_widths: int = 3
    activation_bytes: int = 4
    process_base: int = int(0.8 * GIB)

    def activations(self, hidden: int, intermediate: int) -> int:
        """Bytes of the gate's largest batch in flight (one bound, used by both the reference and the session)."""
        width = hidden * self.activation_hidden_widths + intermediate * self.activation_ffn_widths
        return self.activation_rows * self.activation_tokens * width * self.activation_bytes


COEFFICIENTS = PeakCoefficients()

#: stage -> what it is, for the refusal message
STAGE_MEANING = {
    "torch": "the fp32 PyTorch reference",
    "gate": "the onnxruntime session of the parity gate",
    "calibrate": "int8 calibration on the fp32 graph",
    "gguf": "dequantizing the GGUF file",
}


# -- what there is ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes this process may still use (None: unknown, never refuse) and what bound it."""

    available: int | None
    bound_by: str

    def describe(self) -> str:
        if self.available is None:
            return "unknown"
        return f"{gib(self.available)} ({self.bound_by})"


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def available_memory(
    proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup"), environ: Mapping[str, str] | None = None
) -> MemoryBudget:
    """``MemAvailable``, lowered by a cgroup v2 or v1 limit that applies to this process, capped by
    ``KVEMBED_MEMORY_LIMIT``. Unknown (``available=None``) without ``/proc/meminfo`` and no cap.

    A cgroup's headroom is its limit minus its usage, where reclaimable inactive file cache does
    not count as usage (the kernel drops it before it kills): otherwise a container that has just
    read the checkpoint would look full."""
    environ = os.environ if environ is None else environ
    budget = MemoryBudget(_meminfo_available(proc / "meminfo"), "MemAvailable")
    for headroom, where in _cgroup_headrooms(proc, cgroup_root):
        if budget.available is None or headroom < budget.available:
            budget = MemoryBudget(headroom, where)
    cap = environ.get(LIMIT_ENV, "").strip()
    if cap:
        try:
            limit = parse_size(cap)
        except ValueError as err:
            raise InvalidInput(f"{LIMIT_ENV}: {err}") from None
        if budget.available is None or limit < budget.available:
            budget = MemoryBudget(limit, LIMIT_ENV)
    return budget


def _meminfo_available(path: Path) -> int | None:
    try:
        for line in path.read_text(encoding="ascii").splitlines():
            key, _, value = line.partition(":")
            if key == "MemAvailable":
                return int(value.split()[0]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_headrooms(proc: Path, root: Path) -> list[tuple[int, str]]:
    """(limit - usage, which limit) of every limited cgroup holding this process (its own and its
    ancestors, v2 and v1 memory controller)."""
    v2_path, v1_path = "/", "/"
    try:
        for line in (proc / "self" / "cgroup").read_text(encoding="utf-8").splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                v2_path = path
            elif "memory" in controllers.split(","):
                v1_path = path
    except (OSError, ValueError):
        pass  # no /proc: look at the roots only
    found = []
    layouts = (
        (root, v2_path, "memory.max", "memory.current", "inactive_file", "cgroup v2 memory.max"),
        (root / "memory", v1_path, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file",
         "cgroup v1 memory.limit_in_bytes"),
    )
    for base, own, limit_name, usage_name, inactive_key, label in layouts:
        for folder in _self_and_ancestors(base, own):
            limit = _read_int(folder / limit_name)
            usage = _read_int(folder / usage_name)
            if limit is None or limit >= _UNLIMITED or usage is None:
                continue
            used = max(0, usage - _stat_value(folder / "memory.stat", inactive_key))
            found.append((max(0, limit - used), f"{label} limit {gib(limit)}"))
    return found


def _self_and_ancestors(base: Path, own: str) -> list[Path]:
    """``base/own`` and each parent up to ``base`` that exists (a container's view may not hold
    the host's path at all: then only ``base``)."""
    folders = []
    parts = [p for p in own.split("/") if p and p not in (".", "..")]
    for depth in range(len(parts), -1, -1):
        folder = base.joinpath(*parts[:depth])
        if folder.is_dir():
            folders.append(folder)
    return folders


def _read_int(path: Path) -> int | None:
    """An integer cgroup file; None when absent, unreadable or ``max`` (no limit)."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _stat_value(path: Path, key: str) -> int:
    try:
        for line in path.read_text(encoding="ascii").splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0


# -- what the export needs ----------------------------------------------------------------------


@dataclass(frozen=True)
class ParamCounts:
    """Parameters of a decoder by part: what the reference loads and what the artifact keeps."""

    embedding: int
    per_layer: int
    final_norm: int
    lm_head: int
    num_layers: int
    largest_tensor: int

    def decoder(self, layers: int) -> int:
        """The bare decoder (``AutoModel``: no lm_head) with its first ``layers`` layers."""
        return self.embedding + layers * self.per_layer + self.final_norm


def count_parameters(config: Mapping[str, Any]) -> ParamCounts:
    """Parameter counts of a ``config.json`` of a supported architecture, from the facts of its
    :class:`~kvembed.methods.architectures.Architecture` entry; InvalidInput naming a missing key
    or an unsupported architecture."""

    def need(key: str) -> int:
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInput(f"config.json has no valid {key!r}")
        return value

    arch = SUPPORTED.get(config.get("model_type"))
    if arch is None:
        raise InvalidInput(f"no memory estimate for architecture {config.get('model_type')!r}")
    hidden, ffn, layers = need("hidden_size"), need("intermediate_size"), need("num_hidden_layers")
    heads, vocab = need("num_attention_heads"), need("vocab_size")
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = arch.head_dim(config)
    q, kv = heads * head_dim, kv_heads * head_dim
    attention = hidden * q + 2 * hidden * kv + q * hidden
    if arch.qkv_bias or arch.biased(config, "attention_bias") or arch.biased(config, "use_qkv_bias"):
        attention += q + 2 * kv
    if arch.biased(config, "attention_bias"):
        attention += hidden  # o_proj carries one too
    mlp = 3 * hidden * ffn + (2 * ffn + hidden if arch.biased(config, "mlp_bias") else 0)
    qk_norms = (2 * head_dim if arch.qk_norm_span == "head" else q + kv) if arch.qk_norm else 0
    norm = (2 if arch.norm_bias else 1) * hidden  # one norm's parameters: a weight, and a bias with LayerNorm's
    norms = (4 if arch.sandwich_norms else 1 if arch.parallel_sublayers else 2) * norm + qk_norms
    embedding = vocab * hidden
    tied = bool(config.get("tie_word_embeddings", arch.tied_by_default))
    return ParamCounts(
        embedding=embedding, per_layer=attention + mlp + norms, final_norm=norm, lm_head=0 if tied else embedding,
        num_layers=layers, largest_tensor=max(embedding, hidden * ffn),
    )


@dataclass(frozen=True)
class Estimate:
    """The export's estimated peak: the largest of its stages (bytes each), and the same estimate
    at the other precisions and with the fewest layers, for the refusal's suggestions."""

    precision: str
    stages: Mapping[str, int]
    by_precision: Mapping[str, int]
    fewest_layers_peak: int
    layers_needed: int
    num_layers: int
    params_loaded: int
    params_kept: int

    @property
    def peak(self) -> int:
        return max(self.stages.values())

    @property
    def stage(self) -> str:
        return max(self.stages, key=self.stages.__getitem__)

    def describe(self) -> str:
        return f"{gib(self.peak)} (its largest stage: {STAGE_MEANING.get(self.stage, self.stage)})"


def estimate_export_peak(
    config: Mapping[str, Any],
    precision: str,
    *,
    layers_needed: int | None = None,
    source_dtype: str | None = None,
    gguf: bool = False,
    coefficients: PeakCoefficients = COEFFICIENTS,
) -> Estimate:
    """The export's peak from ``config.json``: ``layers_needed`` decoder layers are exported (None:
    all), ``source_dtype`` is what the checkpoint stores, ``gguf`` when the weights come from a
    GGUF file not yet dequantized. ValueError for an unknown precision or a config missing keys."""
    if precision not in coefficients.session_bytes_per_param:
        raise InvalidInput(f"no memory estimate for precision {precision!r}")
    counts = count_parameters(config)
    layers = counts.num_layers if layers_needed is None else max(1, min(int(layers_needed), counts.num_layers))

    def stages(precision: str, layers: int) -> dict[str, int]:
        return _stages(counts, config, precision, layers, source_dtype, gguf, coefficients)

    return Estimate(
        precision=precision,
        stages=stages(precision, layers),
        by_precision={p: max(stages(p, layers).values()) for p in coefficients.session_bytes_per_param},
        fewest_layers_peak=max(stages(precision, 1).values()),
        layers_needed=layers,
        num_layers=counts.num_layers,
        params_loaded=counts.decoder(counts.num_layers),
        params_kept=counts.decoder(layers),
    )


def _stages(
    counts: ParamCounts, config: Mapping[str, Any], precision: str, layers: int, source_dtype: str | None,
    gguf: bool, c: PeakCoefficients,
) -> dict[str, int]:
    activations = c.activations(int(config["hidden_size"]), int(config["intermediate_size"]))
    # the reference loads the whole bare decoder (every layer; early exit only cuts the forward
    # pass), a 16-bit checkpoint cast to fp32 one tensor at a time: the largest one is held twice
    cast = counts.largest_tensor * _SIXTEEN_BIT.get(str(source_dtype).removeprefix("torch."), 0)
    torch = c.reference_bytes_per_param * counts.decoder(counts.num_layers) + cast
    layer_bytes, embedding_bytes = c.session_bytes_per_param[precision]
    kept_layers = layers * counts.per_layer + counts.final_norm
    session = layer_bytes * kept_layers + embedding_bytes * counts.embedding
    result = {"torch": int(torch) + activations + c.process_base, "gate": int(session) + activations + c.process_base}
    if precision == "int8":  # the recipes calibrate on the fp32 graph in an onnxruntime session first
        fp32_layer, fp32_embedding = c.session_bytes_per_param["fp32"]
        result["calibrate"] = int(fp32_layer * kept_layers + fp32_embedding * counts.embedding) + activations + c.process_base
    if gguf:  # transformers' causal LM, lm_head included, built twice in fp32
        full = counts.decoder(counts.num_layers) + counts.lm_head
        result["gguf"] = int(c.gguf_copies * 4 * full) + c.process_base
    return result


# -- the check ----------------------------------------------------------------------------------


def check_export_memory(estimate: Estimate, budget: MemoryBudget, *, precision: str) -> None:
    """Raise :class:`NotEnoughMemory` when the estimated peak exceeds what is available (an unknown
    budget never refuses); the message says what the export needs, what there is, what to try."""
    if budget.available is None or estimate.peak <= budget.available:
        return
    tries = [
        f"--precision {other} (about {gib(peak)})"
        for other, peak in sorted(estimate.by_precision.items(), key=lambda item: item[1])
        if other != precision and peak <= budget.available
    ]
    if estimate.layers_needed > 1 and estimate.fewest_layers_peak <= budget.available:
        tries.append("fewer layers (an earlier --layers set for va/aligned-wva, or --exit-layer)")
    tries.append(f"a machine with at least {math.ceil(estimate.peak / GIB)} GiB available")
    tries.append("--skip-memory-check (check_memory=False in Python) to try anyway")
    raise NotEnoughMemory(
        f"not enough memory to export at {precision}: it needs about {estimate.describe()}, and this "
        f"process has {budget.describe()}; try {', '.join(tries[:-1])} or {tries[-1]}"
    )


def export_memory_check(model: Any, method: str, precision: str, **method_options: Any) -> Estimate | None:
    """Estimate ``model``'s export from its config (no weights loaded, no network), compare with
    :func:`available_memory` and raise :class:`NotEnoughMemory` when it does not fit; the estimate
    when it does, None when no estimate can be made (a hub id not in the cache, an incomplete
    config.json: warned in one line, never refused)."""
    from ..methods import get_method, resolve
    from ..methods.sharing import resolve_also

    spec = get_method(method)
    if spec.contextual:  # a Causal2Vec checkpoint carries an encoder beside its LLM: not modelled
        return None
    found = _find_config(model, method_options.get("revision"))
    if found is None:
        return None
    config, preset_id, gguf = found
    if config.get("model_type") not in SUPPORTED:
        return None  # the loader refuses it in its own words
    try:
        counts = count_parameters(config)
    except ValueError as err:
        warnings.warn(f"no memory estimate for {model}: {err}; exporting without the memory check",
                      MemoryEstimateWarning, stacklevel=2)
        return None
    # which layers the method runs, from its options alone, as the loader resolves them
    options = {k: v for k, v in method_options.items() if k in spec.option_names}
    auto = str(options.get("layers", "")).strip().lower() == "auto"
    if auto:
        options["layers"] = "none"  # chosen after loading; kv-embedding runs every layer anyway
    resolved = resolve(spec, counts.num_layers, preset_id, **options)
    also = {} if auto else resolve_also(resolved, list(method_options.get("also") or ()), preset_id)
    layers_needed = max([resolved.layers_needed, *(m.layers_needed for m in also.values())])
    dtype = config.get("torch_dtype") or config.get("dtype")
    precision = str(precision).strip().lower()
    # a bf16 export writes and gates the fp32 graph (its OpenVINO compile in the gate is not modelled)
    estimate = estimate_export_peak(
        config, "fp32" if precision == "bf16" else precision, layers_needed=layers_needed,
        source_dtype=None if gguf else dtype, gguf=gguf,
    )
    check_export_memory(estimate, available_memory(), precision=estimate.precision)
    return estimate


def _find_config(model: Any, revision: str | None) -> tuple[dict[str, Any], str | None, bool] | None:
    """(config dict, preset id, weights still to dequantize from a GGUF) without loading weights or
    calling the network: a folder, an alias, a GGUF file, or a hub id already in the HF cache."""
    from ..modeling.gguf import MARKER, cached_folder, find_gguf, read_header, read_info
    from ..methods import resolve_model
    from ..modeling.packaged import ensure_packaged
    from ..modeling.sources import cached_snapshot

    ensure_packaged(str(model))  # a GGUF shipped in parts is joined now (the loader would, next)
    location, preset_id = resolve_model(str(model))
    path = Path(location).expanduser()
    gguf_file = find_gguf(path) if path.exists() else None
    if gguf_file is not None:
        info = read_info(gguf_file)
        cached = cached_folder(info)
        if (cached / MARKER).is_file():  # dequantized by an earlier run: loads like a folder
            return _read_config(cached, model), preset_id, False
        return _gguf_config(read_header(gguf_file), info.architecture, info.model_type), preset_id, True
    if path.is_dir():
        config = _read_config(path, model)
    else:
        snapshot = cached_snapshot(location, revision)  # the local cache only; None if not there
        config = _read_config(Path(snapshot), model) if snapshot is not None else None
    return None if config is None else (config, preset_id, False)


def _read_config(folder: Path, model: Any) -> dict[str, Any] | None:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None  # not a model folder: the loader says so in its own words
    except (OSError, ValueError) as err:
        warnings.warn(f"no memory estimate for {model}: cannot read its config.json ({err})",
                      MemoryEstimateWarning, stacklevel=3)
        return None
    return config if isinstance(config, dict) else None


def _gguf_config(header: Any, architecture: str, model_type: str) -> dict[str, Any]:
    """The config.json keys the estimate reads, from a GGUF header
    (:func:`kvembed.modeling.gguf.read_header`)."""

    def value(key: str) -> Any:
        return header.get(f"{architecture}.{key}")

    tensors = header.tensors
    hidden = value("embedding_length")
    vocab = value("vocab_size")
    if vocab is None and hidden and "token_embd.weight" in tensors:
        vocab = tensors["token_embd.weight"] // int(hidden)
    return {
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": value("feed_forward_length"),
        "num_hidden_layers": value("block_count"),
        "num_attention_heads": value("attention.head_count"),
        "num_key_value_heads": value("attention.head_count_kv"),
        "head_dim": value("attention.key_length"),
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in tensors,
    }
