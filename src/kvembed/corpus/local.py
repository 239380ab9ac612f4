"""``--runner local``: one process, one :class:`Embedder` (opened by the caller before the run writes
anything), shards one after another. No Ray needed."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

from .plan import Shard
from .progress import CorpusProgress
from .worker import ShardWorker


def run_local(worker: ShardWorker, shards: Sequence[Shard], progress: CorpusProgress) -> Iterator[dict[str, Any]]:
    """Embed ``shards`` in this process with ``worker``, yielding each one's statistics as it is published."""
    for shard in shards:
        yield worker.run(shard, progress.advance)
