"""A served model's two lanes: short inputs and long inputs queue apart.

One input is one row of one graph call, and a running call cannot be interrupted: in a single
queue, a one-word request that arrives while a long input is being embedded waits for that whole
call (and, with the long input's request ahead of it in turn, for its window). Inputs of more than
``long_tokens`` tokens go to a lane of their own instead: its own :class:`Batcher` (queue, turns
between requests, worker threads), so a long input's call runs beside the short requests' calls
instead of ahead of them. The long lane's threads run at a lower scheduling priority (the caller
passes ``nice``), so while a short call runs the long one yields the cores to it; either lane
alone has the whole machine (benchmarks/log/serve.md measures a short request's latency with one
lane, two, and two at several priorities).

A request's inputs are split by length, embedded in their lanes at once, and put back in order.
"""

from __future__ import annotations

import asyncio
from contextlib import ExitStack, contextmanager
from typing import Iterator, Sequence

import numpy as np

from ..runtime.encoding import EncodedText
from .batcher import Batcher
from ..errors import InvalidInput


class Lanes:
    """The short lane (every input when there is no long lane) and the optional long lane."""

    def __init__(self, short: Batcher, long: Batcher | None = None, long_tokens: int | None = None) -> None:
        if (long is None) != (long_tokens is None):
            raise InvalidInput("give the long lane and its threshold (long_tokens) together")
        self.short, self.long, self.long_tokens = short, long, long_tokens
        self.embedder = short.embedder

    @property
    def batchers(self) -> list[Batcher]:
        return [self.short] if self.long is None else [self.short, self.long]

    def start(self) -> None:
        for batcher in self.batchers:
            batcher.start()

    async def stop(self, timeout: float | None = None) -> int:
        """:meth:`Batcher.stop` on both lanes at once: the graph calls still running after ``timeout``."""
        return sum(await asyncio.gather(*(batcher.stop(timeout) for batcher in self.batchers)))

    @contextmanager
    def arriving(self) -> Iterator[None]:
        """:meth:`Batcher.arriving` on both lanes: the lengths are known only once tokenised."""
        with ExitStack() as stack:
            for batcher in self.batchers:
                stack.enter_context(batcher.arriving())
            yield

    def is_long(self, item: EncodedText) -> bool:
        return self.long_tokens is not None and len(item.ids) > self.long_tokens

    async def embed(self, items: Sequence[EncodedText], label: str | None, normalize: bool = True) -> np.ndarray:
        """The embeddings of ``items`` (output ``label``) in order, each input embedded in its lane."""
        long = [index for index, item in enumerate(items) if self.is_long(item)]
        if not long or self.long is None:
            return await self.short.embed(items, label, normalize)
        if len(long) == len(items):
            return await self.long.embed(items, label, normalize)
        taken = set(long)
        short = [index for index in range(len(items)) if index not in taken]
        jobs = [asyncio.ensure_future(lane.embed([items[i] for i in indices], label, normalize))
                for lane, indices in ((self.short, short), (self.long, long))]
        try:
            short_rows, long_rows = await asyncio.gather(*jobs)
        finally:  # one lane failed or the client went away: drop what the other still has queued
            for job in jobs:
                job.cancel()
        out = np.empty((len(items), short_rows.shape[1]), dtype=np.float32)
        out[short], out[long] = short_rows, long_rows
        return out
