"""Exceptions that carry a message meant for the user (no imports: every layer can raise them).

The command line prints these as one line on stderr: :class:`CheckFailed` exits 1 (a check ran
and failed), every other :class:`KvembedError` exits 2 (the input or the environment is wrong).
"""

from __future__ import annotations


class KvembedError(Exception):
    """A failure whose message names the problem and the fix."""


class CheckFailed(KvembedError):
    """A check ran and failed (parity gate, benchmark worker): exit code 1, not 2."""


class MissingDependency(KvembedError, RuntimeError):
    """An optional package or provider is absent; the message says what to install."""


class ModelNotFound(KvembedError, FileNotFoundError):
    """A model name is neither a local folder/file nor reachable on the hub."""
