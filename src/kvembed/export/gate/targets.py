"""What ``kvembed verify --backends`` and the parity gate run a graph on: targets of the one
registry (:mod:`kvembed.backends.targets`), chosen by name, by alias (``openvino``: its three) or
``auto`` (every target this machine and this artifact's graph can run), with the reason for each
one skipped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

from ...artifact import MODEL, Manifest, load_manifest
from ...backends.catalogue import target_problem
from ...backends.cpu import cpu_features
from ...backends.protocol import BackendUnavailableError
from ...backends.targets import (
    CPU, CUDA, ORT_TENSORRT, OV_BF16, OV_F16, OV_F32, REFERENCE, TARGET_NAMES, TARGETS, TENSORRT, Target,
    reference_problem,
)
from ...errors import InvalidInput, shown, with_hint

__all__ = [
    "CPU", "CUDA", "ORT_TENSORRT", "OV_BF16", "OV_F16", "OV_F32", "REFERENCE", "REFERENCE_AUTO_LIMIT", "TENSORRT",
    "TARGET_ALIASES", "TARGET_NAMES", "TARGETS", "TARGETS_HELP", "Target", "model_bytes", "reference_problem",
    "resolve_targets", "target_problems",
]

#: names that stand for several targets
TARGET_ALIASES: dict[str, tuple[str, ...]] = {"openvino": (OV_F32, OV_BF16, OV_F16)}
#: ``auto`` offers onnx-reference only below this model size (model.onnx + external data): pure Python is slow
REFERENCE_AUTO_LIMIT = 50 * 1024 * 1024
#: ``kvembed verify --backends`` help
TARGETS_HELP = (
    "Backends to compare the graph on, comma-separated: auto (every backend present; onnx-reference only for "
    f"models under {REFERENCE_AUTO_LIMIT // 1024 // 1024} MB) or names from {', '.join(TARGET_NAMES[:-1])} "
    f"(openvino: all three), {REFERENCE} (e.g. 'auto,{REFERENCE}'); each is compared with {CPU}."
)


def model_bytes(path: str | os.PathLike[str]) -> int:
    """Size of an ONNX file plus its external data (``model.onnx.data``) if any."""
    path = Path(path)
    data = path.with_name(path.name + ".data")
    return sum(p.stat().st_size for p in (path, data) if p.is_file())


def _mb(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MB" if n < 1024 ** 3 else f"{n / 1024 ** 3:.1f} GB"


def target_problems(manifest: Manifest | None = None) -> dict[str, str]:
    """``name -> why it cannot run here`` for every verify target this machine (or this artifact's
    graph: TensorRT's parser takes no int8 one) lacks; absent ones only."""
    problems = {name: why for name in TARGETS if (why := target_problem(name)) is not None}
    graph = {} if manifest is None else manifest.graph.raw
    if TENSORRT not in problems and graph and not graph.get("tensorrt_ready", True):
        ops = ", ".join(graph.get("non_portable_ops", [])) or "int8 weights"  # the one graph whose ops pass but is not ready
        problems[TENSORRT] = f"TensorRT's parser does not take this graph ({ops}); export fp32 or fp16 for TensorRT"
    return problems


def resolve_targets(
    directory: str | os.PathLike[str] | None = None,
    backends: str | Sequence[str] = "auto",
    *,
    manifest: Manifest | None = None,
    model_path: str | os.PathLike[str] | None = None,
    problems: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The targets to compare and ``{skipped target: reason}``.

    ``backends`` is ``"auto"`` (every present target; onnx-reference only for models under
    :data:`REFERENCE_AUTO_LIMIT`), a comma list of names, or a sequence; ``auto`` may be combined
    with names (``"auto,onnx-reference"``). Unknown names raise ValueError naming the valid ones; a
    target asked for by name that this machine lacks raises :class:`BackendUnavailableError`
    saying what to install. Skipped targets (with reasons) are reported only for ``auto``.
    ``problems``: what is absent (default :func:`target_problems`).
    """
    if directory is not None:
        manifest = load_manifest(directory) if manifest is None else manifest
        model_path = Path(directory) / MODEL if model_path is None else model_path
    if model_path is None:
        raise InvalidInput("give an artifact directory or a model path")
    names = [n.strip().lower() for n in (backends.split(",") if isinstance(backends, str) else backends)]
    names = [n for n in names if n]
    if not names:
        raise InvalidInput(f"--backends is empty; give 'auto' or a comma list of {', '.join(TARGET_NAMES)}")
    unknown = [n for n in names if n != "auto" and n not in TARGETS and n not in TARGET_ALIASES]
    if unknown:
        valid = ["auto", *TARGET_NAMES, *TARGET_ALIASES]
        raise InvalidInput(with_hint(f"unknown backend{'s' if len(unknown) > 1 else ''} {', '.join(map(shown, unknown))}; "
                                     f"valid: {', '.join(valid)}", unknown[0], valid))
    names = [member for n in names for member in TARGET_ALIASES.get(n, (n,))]
    problems = target_problems(manifest) if problems is None else dict(problems)
    chosen: set[str] = set()
    skipped: dict[str, str] = {}
    if "auto" in names:
        size = model_bytes(model_path)
        features = cpu_features()
        for name in TARGET_NAMES:
            if name in problems:
                skipped[name] = problems[name]
            elif name == REFERENCE and size >= REFERENCE_AUTO_LIMIT and REFERENCE not in names:
                skipped[name] = (
                    f"model is {_mb(size)} (auto takes it below {_mb(REFERENCE_AUTO_LIMIT)}: pure Python is slow); "
                    f"ask for it with --backends auto,{REFERENCE}"
                )
            elif TARGETS[name].backend == "openvino" and name not in names and not features.runs(TARGETS[name].setting):
                skipped[name] = (f"this CPU has {features.describe_hint(TARGETS[name].setting)}: OpenVINO would "
                                 f"run f32 again; ask for it with --backends auto,{name}")
            else:
                chosen.add(name)
    for name in names:
        if name == "auto":
            continue
        if name in problems:
            raise BackendUnavailableError(f"backend {name} is not available here: {problems[name]}")
        chosen.add(name)
        skipped.pop(name, None)
    if CPU not in problems:  # the baseline every target is compared with, asked for or not
        chosen.add(CPU)
    return [name for name in TARGET_NAMES if name in chosen], skipped
