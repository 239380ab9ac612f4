"""What a corpus run is asked to do, checked once before any work starts. Torch-free, Ray-free."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..backends.targets import PROVIDER_HELP, check_provider
from ..errors import KvembedError
from ..flagfields import flag
from ..runtime.batching import SERVICE_BATCH_TOKENS

FORMATS = ("parquet", "jsonl", "txt")
RUNNERS = ("local", "ray")
DEFAULT_RUNNER = "local"
KINDS = ("document", "query")
#: float vectors, or one of the quantized vector types (:mod:`kvembed.runtime.quantize`)
OUTPUT_DTYPES = ("float32", "float16", "int8", "uint8", "binary", "ubinary")
ON_ERROR = ("fail", "skip")
DEFAULT_ID_COLUMN = "id"
#: the options that decide what the shards hold: a ``--resume`` given another value is refused
RESUME_FIXED = ("artifact", "inputs", "format", "text_column", "id_column", "kind", "rows_per_file", "output_dtype", "on_error",
                "windows")
#: the options that say where and how fast the work runs: a resume may change them (another runner, more workers)
RESUME_FREE = ("runner", "ray_address", "workers", "threads", "provider", "max_batch_tokens")
#: the options ``_run.json`` records and ``--resume`` reads back (all but output, resume, overwrite, progress)
RESUMABLE = RESUME_FIXED + RESUME_FREE


class CorpusError(KvembedError, ValueError):
    """Bad input or a bad request: the message names the problem (file, row) and the fix."""


def _choice(option: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise CorpusError(f"{option} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _positive(option: str, value: int) -> int:
    if int(value) < 1:
        raise CorpusError(f"{option} must be >= 1, got {value}")
    return int(value)


@dataclass(frozen=True)
class CorpusOptions:
    """One ``kvembed embed-corpus`` request; each field with a flag is the option of its name (the
    command line's options are generated from these fields: default and help are said here).

    ``id_column=None`` means: use a column named ``id`` when every input has one, else stable row
    ids ``<file>:<line>`` (TXT/JSONL, 1-based) or ``<file>:<row>`` (Parquet, 0-based).
    ``threads=None`` splits this machine's cores between the workers.
    """

    artifact: Path
    inputs: tuple[str, ...]
    output: Path
    text_column: str = flag("text", "Column (Parquet) or key (JSONL) holding the text.")
    id_column: str | None = flag(None, "Column/key holding ids (default: 'id' if every input has it, else file:line row ids).")
    kind: str = flag("document", "document or query: which prompt the artifact's method uses.")
    format: str | None = flag(None, "parquet, jsonl or txt (default: from the file suffix).")
    runner: str = flag(DEFAULT_RUNNER, "Where the work runs: local (this process) or ray (Ray Data actors).")
    ray_address: str | None = flag(None, "Ray cluster to join: auto or HOST:PORT (default: start a local Ray).")
    workers: int = flag(1, "Ray actors, each with its own Embedder (--runner ray).")
    threads: int | None = flag(None, "onnxruntime threads (= Ray CPUs) per worker (default: cores / workers).",
                               flags=("--threads-per-worker",))
    provider: str = flag("auto", f"Runtime provider of every worker: {PROVIDER_HELP}.")
    max_batch_tokens: int = flag(SERVICE_BATCH_TOKENS, "Padded tokens (rows x longest row) per batch of length-sorted texts; the runtime "
                                 "runs a batch in graph calls of at most its per-call budget.")
    rows_per_file: int = flag(100_000, "Input rows per output shard (shards never span two input files).")
    resume: bool = flag(False, "Finish an interrupted run in --output: finished shards are kept, and the options its "
                        "_run.json records are used (an option given again must not change what the shards hold).")
    overwrite: bool = flag(False, "Delete an earlier run in --output (its shards and records) and start again.")
    output_dtype: str = flag("float32", "float32 or float16 vectors, or quantized: int8 or uint8 (levels of the artifact's "
                             "vector ranges), binary or ubinary (one bit per dimension, packed into bytes).")
    on_error: str = flag("fail", "fail on the first bad record, or skip and count bad records in the manifest.")
    windows: bool = flag(False, "Embed a text longer than the artifact's max_length whole, as windows that each fit, "
                         "averaged into one vector (default: cut it; the manifest counts both).")
    progress: bool | None = flag(None, "Progress bar (default: when stderr is a terminal).",
                                 flags=("--progress/--no-progress",))

    def __post_init__(self) -> None:
        object.__setattr__(self, "artifact", Path(self.artifact))
        object.__setattr__(self, "output", Path(self.output))
        inputs = (self.inputs,) if isinstance(self.inputs, (str, os.PathLike)) else tuple(self.inputs)
        object.__setattr__(self, "inputs", tuple(str(item) for item in inputs))
        if not self.inputs:
            raise CorpusError("give at least one --input file or glob")
        if not self.text_column:
            raise CorpusError("--text-column must not be empty")
        if self.id_column is not None and not self.id_column:
            raise CorpusError("--id-column must not be empty (leave it out for the default)")
        if self.id_column is not None and self.id_column == self.text_column:
            raise CorpusError(f"--id-column and --text-column are both {self.id_column!r}; give two different columns")
        _choice("--kind", self.kind, KINDS)
        if self.format is not None:
            _choice("--format", self.format, FORMATS)
        _choice("--runner", self.runner, RUNNERS)
        try:
            check_provider(self.provider, "--provider")
        except ValueError as err:
            raise CorpusError(str(err)) from None
        _choice("--output-dtype", self.output_dtype, OUTPUT_DTYPES)
        _choice("--on-error", self.on_error, ON_ERROR)
        _positive("--workers", self.workers)
        _positive("--max-batch-tokens", self.max_batch_tokens)
        _positive("--rows-per-file", self.rows_per_file)
        if self.threads is not None:
            _positive("--threads-per-worker", self.threads)
        if self.runner == "local" and self.workers != 1:
            raise CorpusError("--runner local runs one worker; use --threads-per-worker, or --runner ray for --workers > 1")
        if self.resume and self.overwrite:
            raise CorpusError("--resume keeps an earlier run and --overwrite deletes it: pass one of them")
        if self.runner == "local" and self.ray_address is not None:
            raise CorpusError("--ray-address needs --runner ray")

    @property
    def threads_per_worker(self) -> int:
        if self.threads is not None:
            return self.threads
        return max(1, (os.cpu_count() or 1) // self.workers)

    def resumable(self) -> dict[str, Any]:
        """The options ``_run.json`` records (:data:`RESUMABLE`), paths absolute, so that ``--resume``
        needs none of them again, from any working directory."""
        data = {name: getattr(self, name) for name in RESUMABLE}
        data.update(artifact=str(self.artifact.resolve()), inputs=[os.path.abspath(item) for item in self.inputs])
        return data

    def record(self) -> dict[str, Any]:
        """The options as the manifest records them (paths as strings)."""
        data = asdict(self)
        data.update(artifact=str(self.artifact.resolve()), inputs=list(self.inputs), output=str(self.output.resolve()), threads=self.threads_per_worker)
        data.pop("progress")
        return data
