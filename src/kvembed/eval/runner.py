"""Run configurations (an artifact, a model with a method and options, or a trained baseline) over
tasks with mteb.

mteb does the scoring (``mteb.evaluate``, its own result files under ``OUT/mteb``); the model side
is :class:`kvembed.runtime.mteb.MTEBEncoder` over the runtime ``Embedder`` of an artifact, the
PyTorch reference ``TorchEmbedder`` of a model, or a sentence-transformers model
(:mod:`kvembed.eval.baseline`). mteb passes the prompt type per task (retrieval:
queries as ``query``, corpus as ``document``; STS and classification: none, i.e. ``document``) and
the adapter maps it to kvembed's query/document prompts. Configurations run one after another,
each embedder released before the next loads.
"""

from __future__ import annotations

import gc
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..artifact import Manifest
from ..status import waiting
from ..runtime.mteb import MTEBEncoder
from .tasks import LocalTask

#: a configuration label as typed (``LABEL=...``); anything else in a label is kept but sanitised for file names
LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]+")


@dataclass(frozen=True)
class Configuration:
    """One column of the comparison: an artifact directory, a model with a method and options, or
    (``baseline``) a trained sentence-transformers model folder to compare the methods with.

    When several models run the same configurations, ``model`` names the model and ``name`` the
    configuration within it (the label is then ``model/name``), so the report can set the models
    side by side per configuration."""

    label: str
    source: str
    artifact: bool
    method: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    baseline: bool = False
    model: str | None = None
    name: str | None = None
    #: an artifact's manifest, as read once when the configuration was planned
    manifest: Manifest | None = field(default=None, repr=False, compare=False)

    @property
    def slug(self) -> str:
        """The label as mteb's model name part (file-system safe)."""
        return _UNSAFE.sub("_", self.label).strip("_") or "config"

    def describe(self) -> dict[str, Any]:
        return {"label": self.label, "source": self.source, "artifact": self.artifact, "baseline": self.baseline,
                "method": self.method, "options": dict(self.options), "model": self.model, "name": self.name}


class EvalEncoder(MTEBEncoder):
    """:class:`MTEBEncoder` named after its configuration, so that mteb files each
    configuration's results apart, with the framework that actually runs it."""

    def __init__(self, embedder: Any, config: Configuration, batch_size: int) -> None:
        super().__init__(embedder, name=f"kvembed/{config.slug}", batch_size=batch_size)
        self.framework = ["ONNX"] if config.artifact else ["Sentence Transformers", "PyTorch"] if config.baseline else ["PyTorch"]

    @property
    def mteb_model_meta(self) -> Any:
        return super().mteb_model_meta.model_copy(update={"revision": "local", "framework": self.framework})


@dataclass
class ConfigResult:
    """What one configuration scored: per task, mteb's main score and every metric of the test split."""

    config: Configuration
    dim: int
    method: dict[str, Any]
    seconds: float
    scores: dict[str, dict[str, Any]]
    #: what computed the vectors (:func:`precision_record`): the cost of a precision beside its scores
    precision: dict[str, Any] = field(default_factory=dict)


def load_embedder(config: Configuration, *, provider: str = "auto", threads: int | None = None,
                  max_length: int | None = None) -> Any:
    """The runtime Embedder of an artifact, the PyTorch reference of a model, or a trained baseline."""
    if config.baseline:
        from .baseline import BaselineEmbedder

        return BaselineEmbedder.load(config.source, max_length=max_length)
    if config.artifact:
        from ..runtime import Embedder

        return Embedder.load(config.manifest or config.source, provider=provider, threads=threads)
    from ..modeling.reference import TorchEmbedder

    return TorchEmbedder.from_pretrained(config.source, config.method or "kv-embedding", max_length=max_length,
                                         **dict(config.options))


def resolved_method(embedder: Any) -> dict[str, Any]:
    """The method as the embedder resolved it (name, options, layers) for the report."""
    method = embedder.method
    return {"name": method.name, "options": dict(method.options), "layers": list(method.layers)}


def precision_record(embedder: Any, config: Configuration) -> dict[str, Any]:
    """The precision that computed a configuration's vectors, the backend that ran it, and for an
    artifact its parity gate's worst cosine (the certificate of the backend that ran, else the
    export's gate) and the held-out worst cosine measured on texts the gate never decided on (the
    certificate's where its check measured one, else the export's): what a precision costs, shown
    beside what it scores."""
    if config.baseline:
        return {"precision": None, "backend": "sentence-transformers", "gate_worst_cosine": None, "held_out_worst_cosine": None}
    if not config.artifact:
        return {"precision": "fp32", "backend": "pytorch", "gate_worst_cosine": None, "held_out_worst_cosine": None}
    manifest = embedder.artifact
    choice = getattr(embedder, "choice", None)
    certificate = getattr(choice, "certificate", None)
    certified = certificate is not None and certificate.against == "pytorch"
    gate = certificate.worst_cosine if certified else manifest.parity.gate.worst_cosine
    held_out = None if manifest.parity.held_out is None else manifest.parity.held_out.worst_cosine
    if certified and certificate.raw.get("held_out_worst_cosine") is not None:  # an advisory check's own (int8 on OpenVINO)
        held_out = float(certificate.raw["held_out_worst_cosine"])
    return {"precision": manifest.precision, "backend": embedder.target, "gate_worst_cosine": gate, "held_out_worst_cosine": held_out}


def mteb_tasks(tasks: Sequence[LocalTask], official: Sequence[str]) -> list[Any]:
    """mteb task objects: the local tasks, then the official ones (datasets loaded now, or a one-line error)."""
    from .mteb_tasks import official as official_tasks
    from .mteb_tasks import to_mteb

    return [to_mteb(task) for task in tasks] + (official_tasks(list(official)) if official else [])


def evaluate(
    configs: Sequence[Configuration],
    tasks: Sequence[Any],
    out: Path,
    *,
    batch_size: int = 32,
    provider: str = "auto",
    threads: int | None = None,
    max_length: int | None = None,
    on_result: Callable[[ConfigResult], None] | None = None,
    on_load: Callable[[Configuration, Any], None] | None = None,
) -> list[ConfigResult]:
    """Score every configuration on every mteb task; mteb writes its result files under ``out/mteb``.
    ``on_load(config, embedder)`` is told of each embedder as it loads (the CLI says what runs it)."""
    import warnings

    import datasets
    import mteb

    datasets.disable_progress_bars()  # mteb maps its datasets with progress bars of their own
    cache = mteb.ResultCache(cache_path=out / "mteb")
    results: list[ConfigResult] = []
    for config in configs:
        with waiting(f"loading {config.label} ({config.source})"):
            embedder = load_embedder(config, provider=provider, threads=threads, max_length=max_length)
        if on_load is not None:
            on_load(config, embedder)
        encoder = EvalEncoder(embedder, config, batch_size)
        start = time.perf_counter()
        with warnings.catch_warnings(), waiting(f"scoring {config.label} on {len(tasks)} task(s)"):
            # sklearn's per-label precision warns when a weak model never predicts a label; the
            # accuracy mteb reports is well defined regardless
            warnings.filterwarnings("ignore", message="Precision is ill-defined")
            outcome = mteb.evaluate(
                encoder, list(tasks), cache=cache, overwrite_strategy="always", co2_tracker=False,
                show_progress_bar=False, encode_kwargs={"batch_size": batch_size, "show_progress_bar": False},
                raise_error=True,
            )
        seconds = time.perf_counter() - start
        scores = {result.task_name: _test_scores(result) for result in outcome.task_results}
        result = ConfigResult(config, int(embedder.dim), resolved_method(embedder), seconds, scores,
                              precision_record(embedder, config))
        results.append(result)
        if on_result is not None:
            on_result(result)
        del encoder, embedder
        gc.collect()
    return results


def _test_scores(result: Any) -> dict[str, Any]:
    """The test split's scores of an mteb TaskResult (the mean over subsets when there are several)."""
    entries = result.scores.get("test") or next(iter(result.scores.values()))
    main = sum(float(entry["main_score"]) for entry in entries) / len(entries)
    metrics = {k: v for k, v in entries[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {"main_score": main, "subsets": [entry.get("hf_subset") for entry in entries], "metrics": metrics}


def result_files(out: Path) -> list[Path]:
    """mteb's own result files under ``out/mteb`` (one JSON per configuration and task)."""
    root = out / "mteb" / "results"
    return sorted(p for p in root.rglob("*.json") if p.name != "model_meta.json") if root.is_dir() else []


def environment() -> dict[str, Any]:
    """Versions and machine facts recorded with the results."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for package in ("kvembed", "mteb", "onnxruntime", "torch", "transformers", "sentence-transformers"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    return {"versions": versions, "python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}
