"""mkdocs hook: one page per command of the ``kvembed`` tree, under ``reference/cli/``.

Each page is made from the command itself (``kvembed.cli.reference``, the tree ``kvembed --help``
prints): its whole summary, its examples as a code block with one command a line, and its full
help (usage, arguments, options with defaults) as click writes it, unwrapped by any terminal. The
index, ``reference/cli.md``, gets the table of commands where it says ``<!-- commands -->``.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

import click
from mkdocs.structure.files import File, Files

PAGES = "reference/cli"
MARKER = "<!-- commands -->"
WIDTH = 80
#: a line of a docstring that is (the start of) an example command
EXAMPLE = re.compile(r"^(\| )?(kvembed(-export|-layers)?|python|pip|curl) ")


def _commands(group: Any, prefix: str = "kvembed") -> Iterator[tuple[str, Any]]:
    for name, command in sorted(getattr(group, "commands", {}).items()):
        if getattr(command, "hidden", False):
            continue
        path = f"{prefix} {name}"
        yield path, command
        yield from _commands(command, path)


def split_help(text: str) -> tuple[str, list[str], list[str]]:
    """A command's docstring as (summary, example commands, other paragraphs): kvembed's
    docstrings write examples after the summary, ``|`` between them, wrapped anywhere."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", (text or "").replace("\b", "")) if p.strip()]
    if not paragraphs:
        return "", [], []
    summary = " ".join(paragraphs[0].split())
    examples: list[str] = []
    prose: list[str] = []
    for paragraph in paragraphs[1:]:
        lines = [line.strip() for line in paragraph.splitlines() if line.strip()]
        if not lines or not EXAMPLE.match(lines[0]):
            prose.append(" ".join(" ".join(lines).split()))
            continue
        for part in re.split(r"\s+\|\s+|^\|\s+", " ".join(lines)):
            part = part.strip()
            if not part:
                continue
            if EXAMPLE.match(part):
                examples.append(part)
            else:
                prose.append(part[0].upper() + part[1:] + ("" if part.endswith(".") else "."))
    return summary, examples, prose


def full_help(path: str, command: Any) -> str:
    """``PATH --help`` as click's plain formatter writes it (no terminal, no colours)."""
    ctx = click.Context(command, info_name=path, terminal_width=WIDTH, max_content_width=WIDTH)
    formatter = click.HelpFormatter(width=WIDTH, max_width=WIDTH)
    click.Command.format_usage(command, ctx, formatter)
    click.Command.format_options(command, ctx, formatter)
    if isinstance(command, click.Group):
        click.Group.format_commands(command, ctx, formatter)
    click.Command.format_epilog(command, ctx, formatter)
    return formatter.getvalue().rstrip()


def page(path: str, command: Any) -> str:
    summary, examples, prose = split_help(command.help or "")
    parts = [f"# `{path}`", "", summary, ""]
    if examples:
        parts += ["## Examples", "", "```bash", *examples, "```", ""]
    for paragraph in prose:
        parts += [paragraph, ""]
    parts += ["## Usage and options", "", "```text", full_help(path, command), "```", ""]
    return "\n".join(parts)


def _slug(path: str) -> str:
    return path.removeprefix("kvembed ").replace(" ", "-")


def on_files(files: Files, config: Any) -> Files:
    from kvembed.cli.reference import kvembed_command

    for path, command in _commands(kvembed_command()):
        files.append(File.generated(config, f"{PAGES}/{_slug(path)}.md", content=page(path, command)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if page.file.src_uri != f"{PAGES}.md" or MARKER not in markdown:
        return markdown
    from kvembed.cli.reference import kvembed_command

    rows = ["| command | what it does |", "|---|---|"]
    for path, command in _commands(kvembed_command()):
        summary = split_help(command.help or "")[0].replace("|", "\\|")
        rows.append(f"| [`{path}`](cli/{_slug(path)}.md) | {summary} |")
    return markdown.replace(MARKER, "\n".join(rows))
