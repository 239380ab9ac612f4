"""Server settings, and parsing of the command line's artifact and size arguments."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..runtime.artifact import MANIFEST
from ..sizes import parse_size  # noqa: F401  (re-exported: kvembed.serve.parse_size)


@dataclass(frozen=True)
class ServeConfig:
    """Everything the app needs; the CLI flags map one to one (see ``kvembed serve --help``)."""

    artifacts: tuple[tuple[str, Path], ...]
    """(served model name, artifact directory), in the order given."""
    api_key: str | None = None
    max_batch_tokens: int = 16384
    max_batch_size: int = 64
    max_wait_ms: float = 5.0
    max_concurrent_requests: int = 512
    max_client_batch_size: int = 2048
    payload_limit: int = 2_000_000
    threads: int | None = None
    provider: str = "auto"
    #: OpenVINO's precision hint (provider "openvino" only; None: bf16 where the CPU has it)
    ov_precision: str | None = None
    cors_origins: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "max_batch_size", "max_concurrent_requests", "max_client_batch_size", "payload_limit"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max-wait-ms must be >= 0, got {self.max_wait_ms}")
        if not self.artifacts:
            raise ValueError("give at least one artifact directory (written by kvembed-export)")
        names = [name for name, _ in self.artifacts]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"served model names must be unique, {', '.join(duplicates)} repeats; name them NAME=DIR")


def parse_artifact(value: str) -> tuple[str, Path]:
    """``DIR`` (served as the directory's name) or ``NAME=DIR``; the directory must hold a manifest."""
    name, sep, path = value.partition("=")
    directory = Path(path if sep else value)
    if not sep:
        name = directory.resolve().name
    if not name:
        raise ValueError(f"empty model name in {value!r}; use NAME=DIR")
    if not (directory / MANIFEST).is_file():
        raise FileNotFoundError(f"{str(directory)!r} is not a kvembed artifact (no {MANIFEST}); export one with kvembed-export")
    return name, directory
