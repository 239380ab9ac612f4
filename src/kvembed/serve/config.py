"""Server settings, and parsing of the command line's artifact and size arguments."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..artifact import MANIFEST, TRUST_KEY_ENV, trust_key_path
from ..artifact.layout import named_directory
from ..backends.catalogue import PROVIDER_HELP
from ..errors import InvalidInput
from ..flagfields import flag
from ..runtime.batching import CPU_CALL_TOKENS, SERVICE_BATCH_TOKENS, BatchPolicy
from ..sizes import parse_size  # (re-exported: kvembed.serve.parse_size)


#: ``--max-input-tokens``'s default. One input is one row of one graph call, which nothing can
#: interrupt, and its cost grows faster than its length (attention is quadratic; benchmarks/log/serve.md
#: has the times per length): an artifact's own max_length (SmolLM2: 8192) lets one request hold a
#: worker and gigabytes for minutes. 512 is also the limit of most embedding models (BERT-family),
#: so clients already chunk to it; ``--max-input-tokens`` raises it up to the artifact's max_length.
DEFAULT_MAX_INPUT_TOKENS = 512
#: ``--long-input-tokens``'s default: inputs longer than this go to the long lane (kvembed.serve.lanes)
DEFAULT_LONG_INPUT_TOKENS = 128
#: ``--long-lane-nice``'s default: niceness added to the long lane's worker threads. Both lanes'
#: calls want every core; a long call beside a short one at equal priority keeps its share of the
#: cores for the whole short call, at lower priority it yields them while the short call runs (and
#: alone it still has them all). The same threads also compete with other processes on the machine,
#: which then slow long inputs down the more the higher it is: 5 keeps most of the short requests'
#: gain at a small cost there (benchmarks/log/serve.md compares 0, 5, 10 and 19, quiet and loaded).
DEFAULT_LONG_LANE_NICE = 5
#: ``--read-timeout``'s default: ample for a body of --payload-limit on a slow link; a client that
#: trickles its bytes (a slow-loris) holds a socket for no longer than this, and never a request slot
DEFAULT_READ_TIMEOUT = 30.0
#: ``--request-timeout``'s default: past any batch a request of --max-client-batch-size inputs
#: needs on a small CPU, short of a client's own patience
DEFAULT_REQUEST_TIMEOUT = 600.0


def parse_call_cost(value: str) -> int | None | str:
    """``--call-cost``: ``auto``, ``none`` or a number of tokens."""
    text = value.strip().lower()
    if text in ("auto", "none"):
        return None if text == "none" else "auto"
    try:
        return int(text)
    except ValueError:
        raise InvalidInput(f"--call-cost must be auto, none or an integer >= 0 (tokens), got {value!r}") from None


def parse_long_input_tokens(value: str) -> int | None:
    """``--long-input-tokens``: a number of tokens, or ``none`` (one lane)."""
    text = value.strip().lower()
    if text == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidInput(f"--long-input-tokens must be an integer >= 1 (tokens) or none, got {value!r}") from None


@dataclass(frozen=True)
class ServeConfig:
    """Everything the app needs; each field with a flag is the ``kvembed serve`` option of its name
    (the command line's options are generated from these fields: default and help are said here)."""

    artifacts: tuple[tuple[str, Path], ...]
    """(served model name, artifact directory), in the order given."""
    api_key: str | None = flag(None, "Require 'Authorization: Bearer KEY'. Prefer the environment variable KVEMBED_API_KEY: "
                               "a key on the command line shows in ps.", envvar="KVEMBED_API_KEY")
    max_batch_tokens: int = flag(SERVICE_BATCH_TOKENS, "Padded tokens (rows x longest row) per batch; the runtime runs a batch in graph "
                                 f"calls of at most its per-call budget ({CPU_CALL_TOKENS} padded tokens on the CPU and OpenVINO, the "
                                 "whole batch on GPUs).")
    batch_size: int = flag(64, "Rows per batch.")
    max_wait_ms: float = flag(5.0, "Longest wait for requests being tokenised to join a batch.")
    call_cost: int | None | str = flag(
        "auto", "Padded tokens one more batch is worth: batches are cut where padding costs more (auto: "
        "what the backend's calls cost, a few dozen tokens on the CPU, none on GPUs; none: cut only at "
        "--batch-size).", parse=parse_call_cost)
    max_concurrent_requests: int = flag(512, "Requests served at once, counted once a body is read; more get 429.")
    read_timeout: float = flag(DEFAULT_READ_TIMEOUT, "Seconds a client has to send a request's headers, and again its body: "
                               "a connection still sending its headers is closed, a body late gets 408.")
    request_timeout: float = flag(DEFAULT_REQUEST_TIMEOUT, "Seconds a request may take from its body read to its answer; "
                                  "later gets 504 (0: no limit).")
    max_client_batch_size: int = flag(2048, "Inputs per request; more get 400 (as OpenAI answers).")
    payload_limit: int = flag("2MB", "Largest request body (e.g. 2MB, 512KiB); larger get 413.", parse=parse_size)
    max_input_tokens: int = flag(
        DEFAULT_MAX_INPUT_TOKENS, "Tokens one input may have, prompt included (at most each artifact's max_length; GET "
        "/v1/models shows each model's): longer inputs get 413, or are cut with truncate=true in the request (or "
        "--auto-truncate).")
    auto_truncate: bool = flag(False, "Cut over-long inputs of requests that do not say 'truncate' (default: 413, as TEI "
                               "does).", flags=("--auto-truncate/--no-auto-truncate",))
    windows: bool = flag(False, "Embed an input over --max-input-tokens as windows of the cap, one vector from them (requests "
                         "that do not say 'windows'; default off: 413 or truncate).",
                         flags=("--windows/--no-windows",))
    long_input_tokens: int | None = flag(
        str(DEFAULT_LONG_INPUT_TOKENS), "Inputs of more tokens are embedded in a lane of their own, beside short inputs "
        "rather than ahead of them (none: one lane for all).", parse=parse_long_input_tokens)
    long_lane_nice: int = flag(
        DEFAULT_LONG_LANE_NICE, "Niceness (0-19) added to the long lane's threads, so they yield the cores while short "
        "inputs run (0: equal priority; other processes on the machine also outrank them).")
    threads: int | None = flag(None, "onnxruntime intra-op threads per artifact, split among its workers (default: one "
                               "per core).")
    workers: int = flag(1, "Graph calls per artifact running at once, each on threads/workers threads (2 on 2 cores: "
                        "more throughput under load, slower lone requests).")
    provider: str = flag("auto", f"Runtime provider: {PROVIDER_HELP}.")
    #: OpenVINO's precision hint (provider "openvino" only; None: bf16 where the CPU has it)
    ov_precision: str | None = None
    cors_origins: tuple[str, ...] = flag((), "Allow browser calls from this origin (repeatable; default: no CORS).",
                                         flags=("--cors-origin",), many=True)
    trust_key: Path | None = flag(None, "PEM public key: serve only artifacts that kvembed sign signed with its private key, "
                                  "every file as signed (checked before the port is bound; needs the sign extra).",
                                  envvar=TRUST_KEY_ENV)

    def __post_init__(self) -> None:
        if self.api_key == "":  # an empty key could never be sent: it means none (an empty KVEMBED_API_KEY)
            object.__setattr__(self, "api_key", None)
        object.__setattr__(self, "trust_key", trust_key_path(self.trust_key))  # an empty KVEMBED_TRUST_KEY: none
        for name in ("max_batch_tokens", "batch_size", "max_concurrent_requests", "max_client_batch_size", "payload_limit",
                     "max_input_tokens"):
            if getattr(self, name) < 1:
                raise InvalidInput(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.long_input_tokens is not None and self.long_input_tokens < 1:
            raise InvalidInput(f"long-input-tokens must be >= 1 (or none), got {self.long_input_tokens}")
        if not 0 <= self.long_lane_nice <= 19:
            raise InvalidInput(f"long-lane-nice must be in 0-19, got {self.long_lane_nice}")
        if self.threads is not None and self.threads < 1:
            raise InvalidInput(f"threads must be >= 1, got {self.threads}")
        if self.workers < 1:
            raise InvalidInput(f"workers must be >= 1, got {self.workers}")
        if self.call_cost != "auto" and self.call_cost is not None and (not isinstance(self.call_cost, int) or self.call_cost < 0):
            raise InvalidInput(f"call-cost must be auto, none or an integer >= 0 (tokens), got {self.call_cost!r}")
        BatchPolicy(self.batch_size, self.max_batch_tokens, call_cost=None if self.call_cost == "auto" else self.call_cost)
        if not self.read_timeout > 0:
            raise InvalidInput(f"read-timeout must be > 0 seconds, got {self.read_timeout}")
        if not self.request_timeout >= 0:
            raise InvalidInput(f"request-timeout must be >= 0 seconds (0: no limit), got {self.request_timeout}")
        if self.max_wait_ms < 0:
            raise InvalidInput(f"max-wait-ms must be >= 0, got {self.max_wait_ms}")
        if not self.artifacts:
            raise InvalidInput("give at least one artifact directory (written by kvembed-export)")
        names = [name for name, _ in self.artifacts]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise InvalidInput(f"served model names must be unique, {', '.join(duplicates)} repeats; name them NAME=DIR")


    def policy(self, runtime: BatchPolicy) -> BatchPolicy:
        """The batching policy of a served artifact whose embedder's policy is ``runtime``: its
        per-call budget, with this server's rows, padded tokens and call cost per batch."""
        changes = {"batch_size": self.batch_size, "max_batch_tokens": self.max_batch_tokens}
        if self.call_cost != "auto":
            changes["call_cost"] = self.call_cost
        return BatchPolicy.from_options(runtime, **changes)

    @property
    def threads_per_call(self) -> int | None:
        """Intra-op threads of each graph call: ``threads`` (or the cores) split among ``workers``."""
        if self.workers == 1:
            return self.threads
        return max(1, (self.threads or os.cpu_count() or 1) // self.workers)


def parse_artifact(value: str) -> tuple[str, Path]:
    """``DIR`` (served as the directory's name) or ``NAME=DIR`` (:func:`kvembed.artifact.named_directory`);
    the directory must hold a manifest."""
    name, directory = named_directory(value)
    if not (directory / MANIFEST).is_file():
        raise FileNotFoundError(f"{str(directory)!r} is not a kvembed artifact (no {MANIFEST}); export one with kvembed-export")
    return name, directory
