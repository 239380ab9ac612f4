"""Exceptions that carry a message meant for the user (no imports: every layer can raise them).

The command line prints these as one line on stderr: :class:`CheckFailed` exits 1 (a check ran
and failed), every other :class:`KvembedError` exits 2 (the input or the environment is wrong).
Any other exception is a bug, and the command line says so. Bad input raises :class:`InvalidInput`,
which is also a ``ValueError``, so callers' ``except ValueError`` keeps catching it.
"""

from __future__ import annotations


class KvembedError(Exception):
    """A failure whose message names the problem and the fix."""


class InvalidInput(KvembedError, ValueError):
    """Wrong user input (an option, an argument, a file's content): the message names it and the fix."""


class CheckFailed(KvembedError):
    """A check ran and failed (parity gate, benchmark worker): exit code 1, not 2."""


class MissingDependency(KvembedError, RuntimeError):
    """An optional package or provider is absent; the message says what to install."""


class ModelNotFound(KvembedError, FileNotFoundError):
    """A model name is neither a local folder/file nor reachable on the hub."""
