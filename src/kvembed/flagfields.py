"""Dataclass fields that are also command-line options.

A setting's default, type and help are said once, on the field of the dataclass that holds it
(``ServeConfig``, ``CorpusOptions``, Triton's ``ServingOptions``); the command line builds its
options from those fields (:func:`kvembed.cli.options.dataclass_flags`), so the two cannot drift
apart. Standard library only: every room may declare such fields.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

#: the key of a field's metadata that holds its :class:`Flag`
KEY = "kvembed.flag"


@dataclass(frozen=True)
class Flag:
    """How one dataclass field appears on the command line."""

    help: str
    #: typer's declarations, e.g. ``("--input", "-i")`` or ``("--auto-truncate/--no-auto-truncate",)``;
    #: empty: ``--`` + the field's name with dashes
    declarations: tuple[str, ...] = ()
    #: the option takes text, which this turns into the field's value (sizes, ``auto``/``none`` words)
    parse: Callable[[str], Any] | None = None
    #: the default as the command line spells it (options with ``parse``; the field holds its parse)
    text: str | None = None
    envvar: str | None = None
    #: the option may be repeated; the field holds a tuple of its values
    many: bool = False

    def spelled(self, name: str) -> tuple[str, ...]:
        """The declarations of the option of field ``name``: a bool without declarations is the
        single flag ``--name``, not typer's ``--name/--no-name``."""
        return self.declarations or ("--" + name.replace("_", "-"),)


def flag(default: Any, help: str, *, flags: tuple[str, ...] = (), parse: Callable[[str], Any] | None = None,
         envvar: str | None = None, many: bool = False) -> Any:
    """A dataclass field with default ``default`` that is also the option ``flags`` with ``help``.

    With ``parse`` the option takes text: ``default`` is the command line's spelling of the
    default (``"2MB"``) and the field's default is what ``parse`` makes of it."""
    text = default if parse is not None and default is not None else None
    value = parse(default) if text is not None else default  # type: ignore[misc]
    return dataclasses.field(default=value, metadata={KEY: Flag(help, tuple(flags), parse, text, envvar, many)})


def flags_of(cls: type) -> dict[str, tuple[dataclasses.Field, Flag]]:
    """The fields of the dataclass ``cls`` that are options, by name, in declaration order."""
    return {f.name: (f, f.metadata[KEY]) for f in dataclasses.fields(cls) if KEY in f.metadata}


def flag_name(cls: type, name: str) -> str:
    """How the command line spells the option of field ``name`` of ``cls`` (its long form)."""
    option = flags_of(cls).get(name)
    declarations = option[1].spelled(name) if option else ("--" + name.replace("_", "-"),)
    return next(d for d in declarations if d.startswith("--")).split("/")[0]
