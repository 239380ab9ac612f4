"""Timing loop, latency statistics, memory probes and the subjects being compared.

A *subject* is what the bench times (:data:`SUBJECTS`: the runtime on a backend, or the PyTorch
reference). Every subject takes the same padded numpy batch (``TextEncoder.pad`` output) and returns the
embeddings, so what is timed is the model call alone, never tokenisation, and their outputs can be
compared row by row. Torch is imported only inside :class:`TorchSubject`.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from ..backends.catalogue import BACKENDS
from ..export.gate.parity import cosine_rows  # noqa: F401  (torch-free; re-exported for the bench)
from ..errors import InvalidInput

#: the bench's subjects, what it times (``kvembed bench --backends`` names them): the runtime on
#: onnxruntime's CPU provider, the PyTorch reference, the runtime on OpenVINO (the backends
#: catalogue's ``openvino``), and the runtime with ``provider="auto"`` (what ``Embedder.load(dir)``
#: runs: OpenVINO bf16 for a certified bf16 artifact), and ``kvembed serve`` of the artifact with
#: each row its own client (:class:`ServedSubject`)
SUBJECTS = ("runtime", "torch", "openvino", "auto", "served")


def default_subjects() -> tuple[str, ...]:
    """runtime and torch, plus openvino where the catalogue's probe finds it (``kvembed[openvino]``);
    ``auto`` only when asked for (elsewhere it is the runtime again)."""
    return SUBJECTS[:3] if BACKENDS["openvino"].probe() is None else SUBJECTS[:2]

#: a cell whose repeats have a coefficient of variation above this is flagged noisy
NOISY_CV = 0.25


# -- timing -------------------------------------------------------------------------------------


def time_calls(
    fn: Callable[[], Any],
    *,
    warmup: int = 1,
    min_repeats: int = 5,
    min_seconds: float = 1.0,
    max_repeats: int = 1000,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Seconds per call of ``fn``: ``warmup`` untimed calls, then timed calls until both
    ``min_repeats`` calls and ``min_seconds`` of timed calls are done (at most ``max_repeats``).

    A floor on both count and time keeps fast cells statistically meaningful (many samples) and
    slow cells affordable (few samples, but at least ``min_repeats``).
    """
    if warmup < 0:
        raise InvalidInput(f"warmup must be >= 0, got {warmup}")
    if min_repeats < 1:
        raise InvalidInput(f"min_repeats must be >= 1, got {min_repeats}")
    if max_repeats < min_repeats:
        raise InvalidInput(f"max_repeats ({max_repeats}) must be >= min_repeats ({min_repeats})")
    if min_seconds < 0:
        raise InvalidInput(f"min_seconds must be >= 0, got {min_seconds}")
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    spent = 0.0
    while len(samples) < max_repeats:
        start = clock()
        fn()
        took = clock() - start
        samples.append(took)
        spent += took
        if len(samples) >= min_repeats and spent >= min_seconds:
            break
    return samples


#: idle seconds before each interleaved call: onnxruntime's intra-op workers keep spinning for a
#: while after a call returns and would slow the next call timed (a shorter gap measurably did:
#: benchmarks/log/goals-and-profile.md, "The measurement fix").
SETTLE_SECONDS = 0.05


def interleaved(
    calls: dict[str, Callable[[], Any]], rounds: int, warmup: int = 1, gap: float = SETTLE_SECONDS
) -> dict[str, list[float]]:
    """Seconds per call of each entry, the calls taking turns for ``rounds`` rounds: on a machine
    whose speed drifts, the calls of one round see the same conditions, so per-round ratios hold.

    Every timed call starts ``gap`` seconds after the previous one ended, so the previous call's
    spinning thread pool does not take the cores of the one being timed.
    """
    if gap < 0:
        raise InvalidInput(f"gap must be >= 0 seconds, got {gap}")
    for call in calls.values():
        for _ in range(warmup):
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            time.sleep(gap)
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return times


def ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of time(a) / time(b)."""
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


@dataclass(frozen=True)
class Timing:
    """Latency samples of one cell (one subject, precision, batch size and sequence length).

    Throughput is total work over total time: ``texts_per_s = batch_size / mean``, and
    ``tokens_per_s = real_tokens / mean`` counts only non-padding tokens, so
    ``tokens_per_s == texts_per_s * real_tokens / batch_size`` exactly.
    """

    samples: tuple[float, ...]
    """Seconds per call, in the order they were measured."""
    batch_size: int
    real_tokens: int
    """Non-padding tokens per call (whole batch)."""
    warmup: int = 0

    def __post_init__(self) -> None:
        if not self.samples:
            raise InvalidInput("a Timing needs at least one sample")

    @property
    def repeats(self) -> int:
        return len(self.samples)

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(np.asarray(self.samples), q)) * 1e3

    @property
    def p50_ms(self) -> float:
        return self.percentile_ms(50)

    @property
    def p95_ms(self) -> float:
        return self.percentile_ms(95)

    @property
    def p99_ms(self) -> float:
        return self.percentile_ms(99)

    @property
    def mean_ms(self) -> float:
        return float(np.mean(self.samples)) * 1e3

    @property
    def min_ms(self) -> float:
        return float(np.min(self.samples)) * 1e3

    @property
    def cv(self) -> float:
        """Coefficient of variation of the samples (std / mean): how much the repeats disagree."""
        return float(np.std(self.samples) / np.mean(self.samples)) if len(self.samples) > 1 else 0.0

    @property
    def noisy(self) -> bool:
        """Repeats that vary more than :data:`NOISY_CV`: the machine was busy; ratios are unreliable."""
        return self.cv > NOISY_CV

    @property
    def texts_per_s(self) -> float:
        return self.batch_size / (self.mean_ms / 1e3)

    @property
    def tokens_per_s(self) -> float:
        return self.real_tokens / (self.mean_ms / 1e3)

    def to_dict(self) -> dict[str, Any]:
        return {
            "repeats": self.repeats,
            "warmup": self.warmup,
            "p50_ms": self.p50_ms,
            "p95_ms": self.p95_ms,
            "p99_ms": self.p99_ms,
            "mean_ms": self.mean_ms,
            "min_ms": self.min_ms,
            "cv": self.cv,
            "noisy": self.noisy,
            "texts_per_s": self.texts_per_s,
            "tokens_per_s": self.tokens_per_s,
            "samples_s": list(self.samples),
        }


# -- memory -------------------------------------------------------------------------------------


def _proc_status_mb(field: str, pid: int | str = "self") -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MB.

    Linux: ``VmHWM`` of ``/proc/self/status``, the high-water mark of this program's own memory.
    Not ``ru_maxrss``: Linux carries the parent's peak over fork+exec into it, so every child of
    a big orchestrator would report at least the orchestrator's size, many times a small runtime
    process's own peak (docs/decisions/figures-from-code.md). Elsewhere ``ru_maxrss`` (KB on
    Linux, bytes on macOS).
    """
    hwm = _proc_status_mb("VmHWM")
    if hwm is not None:
        return hwm
    try:
        import resource
    except ImportError:  # Windows
        return 0.0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def current_rss_mb() -> float:
    """This process's resident set size now, in MB (``VmRSS``; the peak where /proc is missing)."""
    rss = _proc_status_mb("VmRSS")
    return peak_rss_mb() if rss is None else rss


# -- subjects -----------------------------------------------------------------------------------


class Subject:
    """What the timed subjects share: ``run(batch)`` and ``close()``, usable as a context manager so
    a script's subject is closed (torch's patches restored) before the interpreter tears down."""

    def run(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        raise NotImplementedError

    def encode(self, texts: list[str], kind: str) -> np.ndarray:
        """``texts`` embedded end to end, as a user's call does (only the runtime's subjects)."""
        raise NotImplementedError(f"the {type(self).__name__} has no end-to-end path")

    def peak_rss_mb(self) -> float:
        """The peak resident memory of the process that runs the model: this one."""
        return peak_rss_mb()

    def close(self) -> None:
        """Release what the subject holds."""

    def __enter__(self) -> "Subject":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RuntimeSubject(Subject):
    """The torch-free runtime: the artifact's onnxruntime CPU session, created exactly as
    :meth:`kvembed.runtime.Embedder.load` creates it for users, with ``threads`` intra-op threads."""

    name = "runtime"
    provider = "cpu"

    @staticmethod
    def prepare() -> None:
        """Import what the subject needs (before the RSS baseline, so it measures only loading)."""
        import onnxruntime  # noqa: F401

        from ..runtime import Embedder  # noqa: F401

    def __init__(self, artifact: str | os.PathLike[str], threads: int) -> None:
        from ..runtime import Embedder

        # hashes were checked by the orchestrator (or the exporter just wrote the files)
        self.embedder = Embedder.load(artifact, provider=self.provider, threads=threads, verify=False)
        self.precision = self.embedder.artifact.precision

    def run(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        return self.embedder.run(batch)[0]

    def encode(self, texts: list[str], kind: str) -> np.ndarray:
        return self.embedder.encode(texts, kind=kind)

    def stages(self, texts: list[str], kind: str, calls: int) -> dict[str, float]:
        """Where an :meth:`encode` call's time goes, median ms over ``calls`` calls: ``tokenizer``
        (the text encoder), ``graph`` (every session run of the call), ``around`` (the rest: batch
        planning, padding, slicing, normalisation, the Python between them) and ``total``."""
        rows: dict[str, list[float]] = {"tokenizer": [], "graph": [], "around": [], "total": []}
        with _timed(self.embedder.encoder, "encode") as tokenizer, _timed(self.embedder.session, "run") as graph:
            for _ in range(max(1, calls)):
                tokenizer.clear(), graph.clear()
                start = time.perf_counter()
                self.embedder.encode(texts, kind=kind)
                total = time.perf_counter() - start
                for name, seconds in (("tokenizer", sum(tokenizer)), ("graph", sum(graph)),
                                      ("around", total - sum(tokenizer) - sum(graph)), ("total", total)):
                    rows[name].append(1e3 * seconds)
        return {name: float(statistics.median(values)) for name, values in rows.items()}

    def close(self) -> None:
        self.embedder = None  # type: ignore[assignment]


@contextlib.contextmanager
def _timed(owner: Any, name: str):
    """Time every call of ``owner.name`` while inside (the seconds of each call, in a list): an
    instance attribute over the method, removed after, so the object's own code is what runs."""
    method, spent = getattr(owner, name), []

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)

    setattr(owner, name, timed)
    try:
        yield spent
    finally:
        delattr(owner, name)


class OpenVINOSubject(RuntimeSubject):
    """The runtime with ``provider="openvino"`` (OpenVINO's CPU plugin, its default precision hint:
    bf16 where the CPU lists BF16, else f32). Its precision reads ``ARTIFACT/HINT``, e.g. ``fp32/bf16``."""

    name = "openvino"
    provider = "openvino"

    @staticmethod
    def prepare() -> None:
        RuntimeSubject.prepare()
        import openvino  # noqa: F401

    def __init__(self, artifact: str | os.PathLike[str], threads: int) -> None:
        # measure what a deployment runs: the model imported from its kept compiled blob
        _first_load_elsewhere(artifact, "openvino")
        super().__init__(artifact, threads)
        self.precision = f"{self.precision}/{self.embedder.target.removeprefix('openvino-')}"


def _first_load_elsewhere(artifact: str | os.PathLike[str], provider: str) -> None:
    """Load ``artifact`` once in a throwaway process: a first OpenVINO load (read ONNX, compile,
    write the blob) has a one-time transient that must stay out of the measured process's peak RSS."""
    warm = f"from kvembed.runtime import Embedder; Embedder.load({str(artifact)!r}, provider={provider!r}, threads=1, verify=False)"
    done = subprocess.run([sys.executable, "-c", warm], capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"provider {provider} could not load {artifact}: {(done.stderr.strip().splitlines() or ['?'])[-1]}")


class AutoSubject(RuntimeSubject):
    """The runtime with ``provider="auto"``: whatever :func:`~kvembed.backends.catalogue.choose_backend`
    picks for the artifact on this CPU. Its precision reads ``ARTIFACT/BACKEND``, e.g. ``bf16/openvino-bf16``."""

    name = "auto"
    provider = "auto"

    def __init__(self, artifact: str | os.PathLike[str], threads: int) -> None:
        _first_load_elsewhere(artifact, "auto")  # compiles and keeps the blob if OpenVINO is the pick
        super().__init__(artifact, threads)
        self.precision = f"{self.precision}/{self.embedder.target}"


def served_problem(method: Any, kind: str = "document") -> str | None:
    """Why :class:`ServedSubject` cannot time ``method`` (a ``ResolvedMethod``), or None."""
    if method.takes_ids(kind):
        return None
    return (f"backend served sends token ids, which only raw-text methods take (va, last-token, mean); "
            f"{method.name} prompts its text: time it with auto")


class ServedSubject(Subject):
    """``kvembed serve ARTIFACT`` in a process of its own (``provider="auto"``, as a deployment runs
    it), every row of a batch its own request from its own client, all sent at once: a cell of 32
    rows is 32 clients of one text each, so what is timed is the server's batching of concurrent
    requests, against ``auto``'s one call of the same rows. The rows go as token ids (OpenAI's
    ``input`` of ids), so the server embeds exactly the batch's tokens: only raw-text methods
    (``va``, ``last-token``, ``mean``) take ids, and the server's refusal is the error for others.
    Its precision reads ``ARTIFACT/TARGET``, the target from ``/v1/models``. At most :attr:`CLIENTS`
    requests are in flight at once (the server's own default admits 512)."""

    name = "served"
    CLIENTS = 256

    @staticmethod
    def prepare() -> None:
        from . import served  # noqa: F401

    def __init__(self, artifact: str | os.PathLike[str], threads: int) -> None:
        import json
        import tempfile
        import urllib.request
        from concurrent.futures import ThreadPoolExecutor

        from ..artifact import load_manifest
        from .served import ServerProcess

        manifest = load_manifest(artifact)
        problem = served_problem(manifest.method)
        if problem:
            raise InvalidInput(problem)
        _first_load_elsewhere(artifact, "auto")  # the server then imports its kept compiled blob
        handle, log = tempfile.mkstemp(prefix="kvembed-bench-serve-", suffix=".log")
        os.close(handle)
        self._log = Path(log)
        self.server = ServerProcess([str(artifact), "--threads", str(threads)], self._log, port=0).wait_healthy(600)
        with urllib.request.urlopen(f"{self.server.url}/v1/models", timeout=30) as answer:
            card = json.load(answer)["data"][0]
        self.model = card["id"]
        self.precision = f"{manifest.precision}/{card['target']}"
        self._clients = ThreadPoolExecutor(max_workers=self.CLIENTS, thread_name_prefix="client")

    def _request(self, row: list[int]) -> np.ndarray:
        import json
        import urllib.error
        import urllib.request

        body = json.dumps({"model": self.model, "input": [row]}).encode()
        request = urllib.request.Request(f"{self.server.url}/v1/embeddings", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=600) as answer:
                return np.asarray(json.load(answer)["data"][0]["embedding"], dtype=np.float32)
        except urllib.error.HTTPError as err:  # OpenAI's error body: {"error": {"message": ...}}
            said = err.read().decode(errors="replace")
            with contextlib.suppress(ValueError, KeyError, TypeError):
                said = json.loads(said)["error"]["message"]
            raise InvalidInput(f"kvembed serve answered {err.code}: {said}") from None

    def run(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        rows = [row[kept == 1].tolist() for row, kept in zip(ids, mask)]
        return np.stack(list(self._clients.map(self._request, rows)))

    def peak_rss_mb(self) -> float:
        """The server's peak resident memory (``VmHWM`` of its process), not the clients'."""
        found = _proc_status_mb("VmHWM", self.server.process.pid)
        if found is None:
            raise RuntimeError("kvembed serve's peak memory is not readable (/proc/PID/status)")
        return found

    def close(self) -> None:
        self._clients.shutdown(wait=True, cancel_futures=True)
        self.server.stop()
        self._log.unlink(missing_ok=True)


class TorchSubject(Subject):
    """The PyTorch reference of the artifact (always fp32): its ``EmbeddingModel`` called directly
    under ``torch.inference_mode`` with the method's patches applied once, on ``threads`` threads."""

    name = "torch"
    precision = "fp32"

    @staticmethod
    def prepare() -> None:
        import torch  # noqa: F401
        import transformers  # noqa: F401

        from ..export.gate.verification import reference_for  # noqa: F401

    def __init__(self, artifact: str | os.PathLike[str], threads: int) -> None:
        import torch

        from ..artifact import load_manifest
        from ..export.gate.verification import reference_for

        torch.set_num_threads(int(threads))
        with contextlib.suppress(RuntimeError):  # only allowed before any parallel work
            torch.set_num_interop_threads(1)
        self._torch = torch
        self.embedder = reference_for(load_manifest(artifact))
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(torch.inference_mode())
        self._stack.enter_context(self.embedder.model.patched())

    def run(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        feeds = {name: self._torch.from_numpy(array) for name, array in batch.items()}
        return self.embedder.model(**feeds)[0].float().numpy()

    def close(self) -> None:
        self._stack.close()
