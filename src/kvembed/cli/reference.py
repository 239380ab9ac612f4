"""The ``kvembed`` command tree as a click command, for the docs site's CLI reference.

typer builds a click command from the app; the docs site's hook (``docs/hooks/cli_pages.py``)
writes a page per command from it, so the docs cannot drift from ``kvembed --help``.
``kvembed-export`` and ``kvembed-layers`` are the very apps ``kvembed export`` and ``kvembed
layers`` run, so this one tree documents them too.
"""

from __future__ import annotations

import copy
from typing import Any

import typer

from .main import app


def default_command(group: Any) -> Any | None:
    """The command a group runs when its first argument names none of its commands: by kvembed's
    convention (:func:`kvembed.cli.support.default_command_group`) the hidden command that bears the
    group's own name, as ``kvembed export --model ...`` runs the hidden ``export`` of the group."""
    own = getattr(group, "commands", {}).get(group.name)
    return own if own is not None and own.hidden else None


def documented(command: Any) -> Any:
    """``command`` as a user meets it: a group with a default command is documented as that command
    (its options are what ``kvembed export --help`` lists); its other subcommands keep their own
    pages where the tree has them at the top too (``kvembed export verify`` is ``kvembed verify``).
    Copies only: the app's own tree is left as it is."""
    default = default_command(command)
    if default is not None:
        view = copy.copy(default)
        view.name, view.hidden = command.name, False
        return view
    children = getattr(command, "commands", None)
    if not children:
        return command
    view = copy.copy(command)
    view.commands = {name: documented(child) for name, child in children.items()}
    return view


def kvembed_command() -> Any:
    """The ``kvembed`` tree (what ``kvembed --help`` prints), as the docs' hook reads it."""
    return documented(typer.main.get_command(app))
