"""One worker's job, the same on both runners: read a shard's rows, embed them, write the shard.

Texts are embedded a chunk at a time: tokenised once with the artifact's ``TextEncoder`` (their
token counts and truncation feed the manifest), then embedded by ``Embedder.embed_encoded``, the
runtime's batching loop that ``Embedder.encode`` runs too.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..runtime import Embedder
from ..runtime.batching import BatchPolicy
from ..errors import InvalidInput
from .inputs import Columns, InputFile, RecordPolicy, Rows, read_rows
from .plan import Shard
from .shards import ShardWriter

#: ``progress(rows, tokens)``: rows consumed and tokens embedded since the last call
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Job:
    """Everything a worker needs besides the shard: picklable, sent once to every Ray actor."""

    artifact: str
    threads: int
    kind: str
    max_batch_tokens: int
    output_dtype: str
    on_error: str
    columns: Columns
    files: tuple[InputFile, ...]
    output: str
    provider: str = "auto"


class ShardWorker:
    """Holds one loaded :class:`Embedder` and embeds whole shards with it."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.embedder = Embedder.load(job.artifact, provider=job.provider, threads=job.threads)
        # batches bounded by padded tokens only (no row count: a row has at least one token)
        budget = job.max_batch_tokens
        self.policy = BatchPolicy.from_options(self.embedder.policy, batch_size=budget, max_batch_tokens=budget)

    def encode_records(self, file: Any, chunk: Rows, policy: RecordPolicy) -> tuple[list[Any], list[Any]]:
        """The chunk's ids and encoded texts, without the records the tokenizer refuses (a panic on
        that text): each is an ``--on-error`` bad record, named by its file and row."""
        ids, encoded = [], []
        with warnings.catch_warnings():  # truncation is counted in the manifest instead
            warnings.simplefilter("ignore", UserWarning)
            for ident, text, row in zip(chunk.ids, chunk.texts, chunk.rows):
                try:
                    encoded.append(self.embedder.encoder.encode_one(text, self.job.kind))
                except InvalidInput as err:
                    policy.bad(file, row, str(err))
                    continue
                ids.append(ident)
        return ids, encoded

    def embed(self, encoded: list[Any], progress: Progress) -> tuple[np.ndarray, int, int]:
        """``(vectors, tokens, truncated)`` of the encoded texts, vectors in input order."""
        lengths = [len(item.ids) for item in encoded]
        vectors = self.embedder.embed_encoded(
            encoded, policy=self.policy, on_batch=lambda batch, _: progress(len(batch), sum(lengths[i] for i in batch)))
        return vectors, sum(lengths), sum(item.truncated for item in encoded)

    def run(self, shard: Shard, progress: Progress) -> dict[str, Any]:
        """Embed ``shard`` and publish it; returns its statistics (also stored in the shard)."""
        file = self.job.files[shard.file]
        policy = RecordPolicy(self.job.on_error)
        writer = ShardWriter(Path(self.job.output) / shard.name, self.job.columns.id_type, self.embedder.dim, self.job.output_dtype)
        rows = tokens = truncated = 0
        try:
            for chunk in read_rows(file, shard.start, shard.stop, shard.byte_start, self.job.columns, policy):
                ids, encoded = self.encode_records(file, chunk, policy)
                vectors, chunk_tokens, chunk_truncated = self.embed(encoded, progress)
                writer.write(ids, vectors)
                progress(chunk.span - len(ids), 0)
                rows, tokens, truncated = rows + len(ids), tokens + chunk_tokens, truncated + chunk_truncated
            stats = {
                "shard": shard.name, "input": file.path, "start": shard.start, "stop": shard.stop, "rows": rows,
                "tokens": tokens, "truncated": truncated, "skipped": policy.count, "skip_examples": policy.examples,
                "worker_peak_rss_mb": peak_rss_mb(), "backend": self.embedder.backend,
            }
            writer.commit(stats)
        except BaseException:
            writer.abort()
            raise
        return stats


def peak_rss_mb() -> float | None:
    """This process's peak resident memory so far (None where the OS does not say)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1 << 20 if sys.platform == "darwin" else 1 << 10), 1)  # bytes on macOS, KiB on Linux
