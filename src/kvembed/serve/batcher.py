"""Cross-request dynamic batching: one queue and its worker threads per lane of a served artifact
(:mod:`kvembed.serve.lanes`: short and long inputs queue apart).

The worker fills a *window* of up to ``WINDOW_BATCHES`` batches of token-encoded inputs, taking
at most ``quantum`` inputs per request per turn so a huge request cannot starve the small ones
behind it. The model's :class:`~kvembed.runtime.batching.BatchPolicy` length-sorts the window and
cuts it into batches of at most ``batch_size`` rows and ``max_batch_tokens`` padded tokens, where
padding would cost more than a batch (``call_cost``); a window of several batches gives it more
lengths to sort, which is what keeps padding low (benchmarks/log/serve.md, "`kvembed serve` vs
in-process `Embedder.encode`" and its "Call cost and workers"). Each batch goes to a free worker,
which embeds it with :meth:`Embedder.embed_encoded` (the runtime's batching loop, which keeps a
planned batch whole and runs it in graph calls of at most the runtime's per-call budget); each
request's rows are written back at their input positions.

The worker waits up to ``max_wait_ms`` for more inputs only while accepted requests are still
being tokenised: a lone client never pays the wait. ``workers`` calls run at once on one
thread-safe onnxruntime session, the next window taken only when a worker is free; several
single-threaded calls beat one call on every core when the event loop and clients share the cores
(an intra-op pool stalls at every barrier for a descheduled thread).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from time import perf_counter
from typing import Iterator, Mapping, Sequence

import numpy as np

from ..runtime import Embedder
from ..runtime.batching import BatchPolicy
from ..runtime.encoding import EncodedText
from .metrics import Metrics
from ..errors import InvalidInput

#: a window holds up to this many batches' worth of inputs (see the module docstring)
WINDOW_BATCHES = 4

log = logging.getLogger("uvicorn.error")  # shown with uvicorn's own messages

#: what a window's rows share: the output label and whether the vectors are normalised
_Output = tuple[str | None, bool]


def lower_priority(nice: int) -> None:
    """Raise the calling thread's niceness by ``nice`` (Linux: niceness is per thread), so that under
    contention for the cores the scheduler favours the other threads; alone, the thread still has a
    whole core. No-op where unsupported."""
    if nice <= 0:
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except (AttributeError, OSError):
        pass


@dataclass(eq=False)
class _Job:
    """One request's inputs and where their rows go."""

    items: Sequence[EncodedText]
    label: str | None
    normalize: bool
    out: np.ndarray
    future: asyncio.Future
    next: int = 0
    """First input not yet taken into a window."""
    left: int = 0
    """Inputs not yet embedded."""


class Batcher:
    """The queue and worker of one served artifact."""

    def __init__(
        self,
        embedder: Embedder,
        name: str,
        metrics: Metrics,
        policy: BatchPolicy | None = None,
        max_wait_ms: float = 5.0,
        workers: int = 1,
        lane: str = "",
        nice: int = 0,
    ) -> None:
        if workers < 1:
            raise InvalidInput(f"workers must be >= 1, got {workers}")
        self.embedder, self.name, self.metrics = embedder, name, metrics
        #: rows and padded tokens per batch, call cost, per-call budget (default: the embedder's)
        self.policy = policy or embedder.policy
        self.max_wait = max_wait_ms / 1000
        self.quantum = max(1, math.ceil(self.policy.batch_size / 4))
        self._jobs: deque[_Job] = deque()
        self._queued_items = self._queued_tokens = self._arriving = 0
        self._wake = asyncio.Event()
        self.lane = lane
        self._executor = ThreadPoolExecutor(
            workers, thread_name_prefix=f"kvembed-{name}{'-' + lane if lane else ''}", initializer=lower_priority, initargs=(nice,),
        )
        self._free = asyncio.Semaphore(workers)
        self._calls: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._work(), name=f"kvembed-batcher-{self.name}{'-' + self.lane if self.lane else ''}")

    async def stop(self, timeout: float | None = None) -> int:
        """Take no more windows; wait up to ``timeout`` seconds (None: for ever) for the graph calls
        running now, whose threads cannot be interrupted. Returns how many were still running: left
        behind, their rows' requests already answered (the process exits without joining them)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        running: set[asyncio.Task] = set()
        if self._calls:
            _, running = await asyncio.wait(set(self._calls), timeout=timeout)
        if running:
            log.warning("kvembed serve: %s: %d graph call(s) still running at the graceful timeout; not waiting for them",
                        self.name, len(running))
        self._executor.shutdown(wait=not running, cancel_futures=True)
        return len(running)

    # -- requests --------------------------------------------------------------------------------

    @contextmanager
    def arriving(self) -> Iterator[None]:
        """Announce a request being tokenised for this model, so a filling window waits for it.

        Call :meth:`embed` right after the block, with no ``await`` in between."""
        self._arriving += 1
        try:
            yield
        finally:
            self._arriving -= 1
            self._wake.set()

    async def embed(self, items: Sequence[EncodedText], label: str | None, normalize: bool = True) -> np.ndarray:
        """The embeddings of ``items`` (output ``label``; ``normalize=False``: the pooled vectors), in order."""
        loop = asyncio.get_running_loop()
        out = np.empty((len(items), self.embedder.dim_of(label)), dtype=np.float32)
        job = _Job(items, label, normalize, out, loop.create_future(), left=len(items))
        if not items:
            return out
        self._jobs.append(job)
        self._count(len(items), sum(len(item.ids) for item in items))
        self._wake.set()
        try:
            return await job.future
        finally:
            if job.future.cancelled() and job in self._jobs:  # the client went away: drop what is left
                self._jobs.remove(job)
                rest = job.items[job.next :]
                self._count(-len(rest), -sum(len(item.ids) for item in rest))

    def _count(self, items: int, tokens: int) -> None:
        self._queued_items += items
        self._queued_tokens += tokens
        self.metrics.queue_depth.labels(self.name).inc(items)  # inc, not set: a model's lanes share the gauge

    # -- worker ----------------------------------------------------------------------------------

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._jobs:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._free.acquire()  # the window is taken when a worker can start on it
            await self._fill(loop)
            key, window = self._take_window() if self._jobs else ((None, True), [])
            await self._run_window(loop, key, window)

    async def _fill(self, loop: asyncio.AbstractEventLoop) -> None:
        deadline = loop.time() + self.max_wait
        while self._arriving and not self._full():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except asyncio.TimeoutError:
                return

    def _full(self) -> bool:
        tokens = self.policy.max_batch_tokens
        return self._queued_items >= self.policy.batch_size or (tokens is not None and self._queued_tokens >= tokens)

    def _take_window(self) -> tuple[_Output, list[tuple[_Job, int]]]:
        """Up to a window of inputs, ``quantum`` per request per turn, from requests of the head's output."""
        label = (self._jobs[0].label, self._jobs[0].normalize)
        max_items = self.policy.batch_size * WINDOW_BATCHES
        max_tokens = math.inf if self.policy.max_batch_tokens is None else self.policy.max_batch_tokens * WINDOW_BATCHES
        window: list[tuple[_Job, int]] = []
        tokens = 0
        progress = True
        while progress:
            progress = False
            for job in self._jobs:
                if (job.label, job.normalize) != label:
                    continue
                for _ in range(self.quantum):
                    if job.next >= len(job.items):
                        break
                    size = len(job.items[job.next].ids)
                    if window and (len(window) >= max_items or tokens + size > max_tokens):
                        return self._taken(label, window, tokens)
                    window.append((job, job.next))
                    job.next += 1
                    tokens += size
                    progress = True
        return self._taken(label, window, tokens)

    def _taken(self, label: _Output, window: list[tuple[_Job, int]], tokens: int) -> tuple[_Output, list[tuple[_Job, int]]]:
        self._count(-len(window), -tokens)
        head = self._jobs[0]
        self._jobs = deque(job for job in self._jobs if job.next < len(job.items))
        if self._jobs and self._jobs[0] is head:  # the next window starts with the next request
            self._jobs.rotate(-1)
        return label, window

    async def _run_window(self, loop: asyncio.AbstractEventLoop, label: _Output, window: list[tuple[_Job, int]]) -> None:
        """Dispatch the window's batches, each as soon as a worker is free; the caller holds
        one free worker already (released here if the window turns out empty)."""
        lengths = [len(job.items[index].ids) for job, index in window]
        held = True
        for batch in self.policy.plan(lengths):
            if not held:
                await self._free.acquire()
            held = False
            rows = [window[k] for k in batch if not window[k][0].future.done()]
            if not rows:
                self._free.release()
                continue
            call = loop.create_task(self._call(loop, label, rows))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)
        if held:
            self._free.release()

    async def _call(self, loop: asyncio.AbstractEventLoop, key: _Output, rows: list[tuple[_Job, int]]) -> None:
        """One planned batch on a worker thread, through the runtime's batching loop; its rows go
        back to their requests."""
        try:
            items = [job.items[index] for job, index in rows]
            start = perf_counter()
            with self.metrics.calls_running.labels(self.name).track_inprogress():
                embedding = await loop.run_in_executor(
                    self._executor, partial(self.embedder.embed_encoded, items, key[0], policy=self.policy, normalize=key[1],
                                            on_batch=self._observe))
            self.metrics.inference.labels(self.name).observe(perf_counter() - start)
        except Exception as err:  # a failed graph call fails its requests, never the worker
            log.exception("graph call of %s failed", self.name)
            for job, _ in rows:
                if not job.future.done():
                    job.future.set_exception(err)
            return
        finally:
            self._free.release()
        for (job, index), vector in zip(rows, embedding, strict=True):
            if job.future.done():
                continue
            job.out[index] = vector
            job.left -= 1
            if job.left == 0:
                job.future.set_result(job.out)

    def _observe(self, indices: list[int], batch: Mapping[str, np.ndarray]) -> None:
        """Metrics of one padded batch (called on the worker thread; prometheus is thread-safe)."""
        self.metrics.batch_size.labels(self.name).observe(len(indices))
        self.metrics.batch_tokens.labels(self.name).observe(batch["input_ids"].size)
