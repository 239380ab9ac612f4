"""Exceptions that carry a message meant for the user (the standard library only: every layer can
raise them), and :func:`did_you_mean` for their messages.

The command line prints these as one line on stderr (a few where :attr:`KvembedError.lines` says
so): :class:`CheckFailed` exits 1 (a check ran and failed), every other :class:`KvembedError`
exits 2 (the input or the environment is wrong). Any other exception is a bug, and the command
line says so. Bad input raises :class:`InvalidInput`, which is also a ``ValueError``, so callers'
``except ValueError`` keeps catching it.
"""

from __future__ import annotations

from typing import Iterable

#: the most lines a user error's message runs to (:attr:`KvembedError.lines`), none over :data:`LINE_WIDTH`
MAX_LINES, LINE_WIDTH = 3, 100


class KvembedError(Exception):
    """A failure whose message names the problem and the fix.

    The command line prints the message's first line; an error class whose fix needs lines of its
    own sets :attr:`lines` (at most :data:`MAX_LINES`): what failed, then the fix, each line short."""

    #: how many lines of the message the command line prints
    lines: int = 1


class InvalidInput(KvembedError, ValueError):
    """Wrong user input (an option, an argument, a file's content): the message names it and the fix."""


class CheckFailed(KvembedError):
    """A check ran and failed (parity gate, benchmark worker): exit code 1, not 2."""


class MissingDependency(KvembedError, RuntimeError):
    """An optional package or provider is absent; the message says what to install."""


class ModelNotFound(KvembedError, FileNotFoundError):
    """A model name is neither a local folder/file nor reachable on the hub."""


class ModelNotLocal(ModelNotFound):
    """A model name that is neither a local folder/file nor in the hub cache, with the hub out of
    reach (unreachable, or ``HF_HUB_OFFLINE`` set): what failed, then the fixes, on their own lines."""

    lines = 3


#: how much of a user's name or value a message repeats
SHOWN = 60


def shown(value: object) -> str:
    """``value`` as a message repeats it: quoted, and cut to :data:`SHOWN` characters, so a crafted
    megabyte of name does not come back as a megabyte of error."""
    text = repr(value)
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text)} characters)"


def did_you_mean(name: object, choices: Iterable[str]) -> str:
    """``did you mean 'kv-embedding'?`` for a mistyped ``name`` close to one of ``choices``
    (:func:`difflib.get_close_matches`, case and ``_``/``-`` ignored), or ``""`` when none is close.
    A name far longer than every choice is not compared (it is no typo, and comparing costs its length
    times theirs)."""
    import difflib

    options = [str(choice) for choice in choices]
    text = str(name).strip().lower().replace("_", "-")
    if not text or not options or len(text) > 2 * max(len(option) for option in options) + 2:
        return ""
    folded = {option.lower().replace("_", "-"): option for option in options}
    found = difflib.get_close_matches(text, list(folded), n=1, cutoff=0.6)
    return f"did you mean {folded[found[0]]!r}?" if found else ""


def with_hint(message: str, name: object, choices: Iterable[str]) -> str:
    """``message``, and ``; did you mean '...'?`` where ``name`` is close to one of ``choices``
    (:func:`did_you_mean`): the one way an error about a mistyped name ends."""
    hint = did_you_mean(name, choices)
    return f"{message}; {hint}" if hint else message
