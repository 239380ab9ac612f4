"""``--runner ray``: the same shard jobs scheduled by Ray Data over an actor pool.

``ray.data.from_items`` holds one row per pending shard (one block each), and ``map_batches``
runs :class:`ShardActor`, a callable class that loads the :class:`Embedder` once per actor
(a fixed pool of ``workers`` actors, ``num_cpus=threads`` each). An actor reads its shard's rows
with pyarrow (column projection, only the row groups or byte range it needs), embeds them with
the runtime's length-sorted token-budget batching and writes the shard itself, so shards are
the same files, named the same way, as ``--runner local`` writes, and ``--resume`` works across
runners. Ray Data brings the scheduling on a cluster; an actor that dies fails the run (no
restarts, see :func:`run_ray`), and ``--resume`` finishes it.

On a cluster the artifact directory, the inputs and ``--output`` must be reachable at the same
paths from every node (shared storage such as NFS), and kvembed must be installed on every node.

Each actor loads its own session, so each reserves Ray's ``memory`` resource for one
(:func:`actor_memory`): Ray then places no more actors on a node than its memory holds, instead of
starting them all and letting the node run out (a multi-GB artifact per actor).
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, Iterator, Sequence

import numpy as np
import ray

from ..backends.catalogue import session_memory
from ..status import waiting
from .options import CorpusError
from .plan import Shard
from .progress import CorpusProgress
from .worker import Job, ShardWorker

#: seconds between progress reports from actors to the driver
REPORT_EVERY = 0.5
#: what an actor holds besides its session: Ray's worker process, pyarrow, a chunk of rows and vectors
ACTOR_OVERHEAD = 512 * 1024**2


def actor_memory(job: Job) -> int:
    """Bytes of Ray's ``memory`` resource one actor reserves: its session's peak, from the
    artifact's files (:func:`kvembed.backends.catalogue.session_memory`), plus :data:`ACTOR_OVERHEAD`."""
    return session_memory(job.artifact, job.provider) + ACTOR_OVERHEAD


def actors_that_fit(memory: int, cpus: int) -> int:
    """How many actors reserving ``memory`` bytes and ``cpus`` CPUs the live nodes hold."""
    fit = 0
    for node in ray.nodes():
        if node.get("Alive"):
            resources = node.get("Resources", {})
            fit += min(int(resources.get("memory", 0) // memory), int(resources.get("CPU", 0) // cpus))
    return fit


@ray.remote(num_cpus=0)
class ProgressCounter:
    """Rows and tokens reported by the actors since the driver last looked."""

    def __init__(self) -> None:
        self.rows = self.tokens = 0

    def add(self, rows: int, tokens: int) -> None:
        self.rows += rows
        self.tokens += tokens

    def take(self) -> tuple[int, int]:
        taken = (self.rows, self.tokens)
        self.rows = self.tokens = 0
        return taken


class ShardActor:
    """A Ray Data actor: one :class:`ShardWorker` (one loaded Embedder) for its whole life."""

    def __init__(self, job: Job, counter: Any) -> None:
        self.worker = ShardWorker(job)
        self.counter = counter

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = []
        for spec in batch["shard"]:
            results.append(json.dumps(self._run(Shard(**json.loads(spec)))))
        return {"stats": np.array(results, dtype=object)}

    def _run(self, shard: Shard) -> dict[str, Any]:
        pending = [0, 0, time.monotonic()]

        def report(rows: int, tokens: int) -> None:
            pending[0] += rows
            pending[1] += tokens
            if time.monotonic() - pending[2] >= REPORT_EVERY:
                self.counter.add.remote(pending[0], pending[1])
                pending[:] = [0, 0, time.monotonic()]

        try:
            # what Ray gave this actor travels back with the statistics (not stored in the shard)
            return {**self.worker.run(shard, report), "ray_resources": ray.get_runtime_context().get_assigned_resources()}
        except CorpusError as err:  # bad input: reported to the driver as data, not as a crash
            return {"shard": shard.name, "error": str(err)}
        finally:
            self.counter.add.remote(pending[0], pending[1])


#: seconds to wait for a TCP connection to ``--ray-address HOST:PORT``
CONNECT_TIMEOUT = 5.0


def check_address(address: str | None) -> None:
    """Fail in seconds when ``--ray-address HOST:PORT`` has nothing listening: ``ray.init`` itself
    retries such an address for minutes, logging every attempt. ``auto`` and ``ray://`` addresses
    are left to Ray (``auto`` fails at once when no cluster runs)."""
    if address is None or address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise CorpusError(f"--ray-address {address!r} is not auto or HOST:PORT (e.g. 10.0.0.1:6379)")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT):
            pass
    except OSError as err:
        raise CorpusError(
            f"cannot connect to a Ray cluster at --ray-address {address} ({' '.join(str(err).split()) or type(err).__name__}); "
            "start one with `ray start --head` or leave --ray-address out for a local Ray"
        ) from None


@contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """Use the running Ray session, or connect to ``address`` (``auto`` or ``HOST:PORT``), or
    start a local one; shut down only what was started here."""
    if ray.is_initialized():
        yield
        return
    with _keep_sigterm_handler():
        try:
            # Ray's warnings on a healthy run (token auth on by default, Ray Data's progress bars
            # off) are not the user's business; its errors, and the workers' output, still show
            with waiting("starting a local Ray" if address is None else f"connecting to the Ray cluster at {address}"):
                ray.init(address=address, include_dashboard=False, logging_level=logging.ERROR, configure_logging=True)
        except ConnectionError as err:
            raise CorpusError(
                f"cannot connect to a Ray cluster at --ray-address {address} ({err}); start one with `ray start --head` "
                "or leave --ray-address out for a local Ray"
            ) from None
    try:
        yield
    finally:
        ray.shutdown()


@contextmanager
def _keep_sigterm_handler() -> Iterator[None]:
    """``ray.init`` makes SIGTERM ``sys.exit(15)`` in the driver (and Ray's C++ failure handler
    prints a stack dump for it): put back a Python handler the caller had set, such as the CLI's
    SIGTERM-as-Ctrl-C, so the run still stops through its cleanup. Ray's stays in place of the default."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if callable(previous):
            signal.signal(signal.SIGTERM, previous)


def run_ray(job: Job, shards: Sequence[Shard], workers: int, progress: CorpusProgress) -> Iterator[dict[str, Any]]:
    """Embed ``shards`` on Ray actors, yielding each shard's statistics as it is published."""
    if not shards:
        return
    cpus = ray.cluster_resources().get("CPU", 0)
    if workers * job.threads > cpus:
        raise CorpusError(
            f"--workers {workers} x --threads-per-worker {job.threads} needs {workers * job.threads} CPUs, "
            f"the Ray cluster has {cpus:g}; lower them or add nodes"
        )
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the corpus bar shows rows, tokens/s and ETA instead
    context.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    memory = actor_memory(job)
    if actors_that_fit(memory, job.threads) < workers:
        have = ray.cluster_resources().get("memory", 0)
        raise CorpusError(
            f"--workers {workers} actors each need {memory / 1e9:.1f} GB of memory (one session of {job.artifact}); "
            f"the Ray cluster's nodes hold {actors_that_fit(memory, job.threads)} of them ({have / 1e9:.1f} GB of memory "
            "resource in all): lower --workers, add nodes, or give Ray more memory (ray start --memory BYTES)"
        )
    counter = ProgressCounter.remote()
    # no more actors than shards: an actor without a shard only loads the artifact, and Ray Data
    # warns that the pool cannot be used (a resume with fewer shards left than --workers)
    actors = min(workers, len(shards))
    with warnings.catch_warnings():
        # Ray Data's own way to turn restarts off (its actor pool's comment says so); Ray 2.60
        # calls every such keyword deprecated without naming a replacement for this one
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        dataset = _shard_dataset(job, shards, actors, memory, counter)
    stop = threading.Event()
    poller = threading.Thread(target=_poll, args=(counter, progress, stop), daemon=True)
    poller.start()
    try:
        for row in dataset.iter_rows():
            stats = json.loads(row["stats"])
            if "error" in stats:
                raise CorpusError(stats["error"])
            yield stats
    finally:
        stop.set()
        poller.join()
        progress.advance(*ray.get(counter.take.remote()))
        ray.kill(counter)


def _shard_dataset(job: Job, shards: Sequence[Shard], actors: int, memory: int, counter: Any) -> Any:
    """One row per shard, each run by a pool of ``actors`` :class:`ShardActor` s."""
    return ray.data.from_items(
        [{"shard": json.dumps(asdict(shard))} for shard in shards], override_num_blocks=len(shards)
    ).map_batches(
        ShardActor,
        batch_size=1,
        # one shard in flight per actor: shards are long, so queueing more only unbalances the tail
        compute=ray.data.ActorPoolStrategy(size=actors, max_tasks_in_flight_per_actor=1),
        num_cpus=job.threads,
        memory=memory,
        fn_constructor_kwargs={"job": job, "counter": counter},
        # no actor restarts: Ray Data passes an actor its constructor's arguments through the object
        # store, where a restart may not find them (ray-project/ray#53727; Ray logs an error for
        # every such pool); a failed actor fails the run, whose finished shards --resume keeps
        max_restarts=0,
    )


def _poll(counter: Any, progress: CorpusProgress, stop: threading.Event) -> None:
    while not stop.wait(REPORT_EVERY):
        progress.advance(*ray.get(counter.take.remote()))
