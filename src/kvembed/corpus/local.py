"""``--runner local``: one process, one :class:`Embedder`, shards one after another. No Ray needed."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

from .plan import Shard
from .progress import CorpusProgress
from .worker import Job, ShardWorker


def run_local(job: Job, shards: Sequence[Shard], progress: CorpusProgress) -> Iterator[dict[str, Any]]:
    """Embed ``shards`` in this process, yielding each one's statistics as it is published."""
    if not shards:
        return
    worker = ShardWorker(job)
    for shard in shards:
        yield worker.run(shard, progress.advance)
