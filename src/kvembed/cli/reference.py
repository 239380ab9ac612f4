"""The click command of ``kvembed``'s typer app, for the docs site's CLI reference.

mkdocs-click documents a click command; typer builds one from the app on demand. Generating the
reference from the command tree itself means the docs cannot drift from ``kvembed --help``.
``kvembed-export`` and ``kvembed-layers`` are aliases of ``kvembed export`` and ``kvembed layers``,
so this one tree documents them too.
"""

from __future__ import annotations

import click
import typer

from .main import app


def kvembed_command() -> click.Command:
    """The ``kvembed`` command tree as click sees it (what ``kvembed --help`` prints)."""
    return typer.main.get_command(app)


#: the tree mkdocs-click reads (``:command: command`` in docs/reference/cli.md)
command: click.Command = kvembed_command()
