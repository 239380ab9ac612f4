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
from ..runtime.quantize import RANGED, quantize
from ..runtime.windows import per_input
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
    windows: bool = False


class ShardWorker:
    """Holds one loaded :class:`Embedder` and embeds whole shards with it."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.embedder = Embedder.load(job.artifact, provider=job.provider, threads=job.threads)
        # batches bounded by padded tokens only (no row count: a row has at least one token)
        budget = job.max_batch_tokens
        self.policy = BatchPolicy.from_options(self.embedder.policy, batch_size=budget, max_batch_tokens=budget)

    def encode_records(self, file: Any, chunk: Rows, policy: RecordPolicy) -> tuple[list[Any], list[Any], list[int]]:
        """The chunk's ids, encoded texts and how many items each record became (one, or with
        ``--windows`` its windows), without the records the tokenizer refuses (a panic on that
        text): each is an ``--on-error`` bad record, named by its file and row."""
        ids, encoded, counts = [], [], []
        encoder = self.embedder.encoder
        with warnings.catch_warnings():  # truncation is counted in the manifest instead
            warnings.simplefilter("ignore", UserWarning)
            for ident, text, row in zip(chunk.ids, chunk.texts, chunk.rows):
                try:
                    items = encoder.encode_windows(text, self.job.kind) if self.job.windows else [encoder.encode_one(text, self.job.kind)]
                except InvalidInput as err:
                    policy.bad(file, row, str(err))
                    continue
                ids.append(ident)
                encoded.extend(items)
                counts.append(len(items))
        return ids, encoded, counts

    def embed(self, encoded: list[Any], progress: Progress, counts: list[int] | None = None) -> tuple[np.ndarray, int, int]:
        """``(vectors, tokens, truncated)`` of the encoded texts, vectors in input order; with
        ``counts`` (a record's windows each, `encode_records`) one vector per record, aggregated."""
        lengths = [len(item.ids) for item in encoded]
        windowed = counts is not None and len(counts) != len(encoded)
        vectors = self.embedder.embed_encoded(  # windows are not rows of the input: rows are counted once aggregated
            encoded, policy=self.policy,
            on_batch=lambda batch, _: progress(0 if windowed else len(batch), sum(lengths[i] for i in batch)))
        if windowed:
            assert counts is not None
            vectors = per_input(vectors, encoded, counts)
            progress(len(counts), 0)
        return vectors, sum(lengths), sum(item.truncated for item in encoded)

    def typed(self, vectors: np.ndarray) -> np.ndarray:
        """``vectors`` as ``--output-dtype`` stores them: floats as they are (the writer casts them),
        a vector type quantized (int8 / uint8: levels of `Embedder.vector_ranges`)."""
        dtype = self.job.output_dtype
        if dtype.startswith("float"):
            return vectors
        return quantize(vectors, dtype, self.embedder.vector_ranges() if dtype in RANGED else None)

    def run(self, shard: Shard, progress: Progress) -> dict[str, Any]:
        """Embed ``shard`` and publish it; returns its statistics (also stored in the shard)."""
        file = self.job.files[shard.file]
        policy = RecordPolicy(self.job.on_error)
        writer = ShardWriter(Path(self.job.output) / shard.name, self.job.columns.id_type, self.embedder.dim, self.job.output_dtype)
        rows = tokens = truncated = windowed = 0
        try:
            for chunk in read_rows(file, shard.start, shard.stop, shard.byte_start, self.job.columns, policy):
                ids, encoded, counts = self.encode_records(file, chunk, policy)
                vectors, chunk_tokens, chunk_truncated = self.embed(encoded, progress, counts)
                windowed += sum(count > 1 for count in counts)
                writer.write(ids, self.typed(vectors))
                progress(chunk.span - len(ids), 0)
                rows, tokens, truncated = rows + len(ids), tokens + chunk_tokens, truncated + chunk_truncated
            stats = {
                "shard": shard.name, "input": file.path, "start": shard.start, "stop": shard.stop, "rows": rows,
                "tokens": tokens, "truncated": truncated, "windowed": windowed, "skipped": policy.count, "skip_examples": policy.examples,
                "worker_peak_rss_mb": peak_rss_mb(), "backend": self.embedder.target,
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
