"""mkdocs hook: publish the lab notes (``benchmarks/log/*.md``) as pages under ``lab/``.

The notes live beside the benchmarks that write them, and are read on GitHub too; on the site
their links are mended: another note stays a link, a docs page becomes the page's site-relative
link, a picture under ``benchmarks/results/`` is published beside the notes, and any other file
of the repository (a script, a JSON record) becomes its path in code, since the site does not
hold it. Nothing is written into the repository.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "benchmarks" / "log"
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
LAB = "lab"
PICTURES = (".png", ".svg", ".jpg", ".jpeg", ".gif")
#: ``[text](target)`` and ``![alt](target)``, the target without spaces or a title
LINK = re.compile(r"(!?)\[([^\]\n]*)\]\(([^)\s]+)\)")


def _target(target: str) -> tuple[Path | None, str]:
    """A note's link target as a repository path (None for a URL or an in-page anchor) and its ``#...``."""
    path, _, fragment = target.partition("#")
    if not path or re.match(r"^[a-z][a-z0-9+.-]*:", path):
        return None, fragment
    return (LOG / path).resolve(), fragment


def on_files(files: Files, config: Any) -> Files:
    for note in sorted(LOG.glob("*.md")):
        files.append(File.generated(config, f"{LAB}/{note.name}", abs_src_path=str(note)))
        for _, _, target in LINK.findall(note.read_text(encoding="utf-8")):
            path, _ = _target(target)
            if path is not None and path.suffix.lower() in PICTURES and RESULTS in path.parents and path.is_file():
                uri = f"{LAB}/results/{path.relative_to(RESULTS).as_posix()}"
                if files.get_file_from_path(uri) is None:
                    files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if not page.file.src_uri.startswith(f"{LAB}/"):
        return markdown

    def mend(match: re.Match[str]) -> str:
        bang, text, target = match.groups()
        path, fragment = _target(target)
        anchor = f"#{fragment}" if fragment else ""
        if path is None:
            return match.group(0)
        if path.parent == LOG and path.suffix == ".md":
            return match.group(0)
        if DOCS in path.parents and path.suffix == ".md":
            return f"{bang}[{text}](../{path.relative_to(DOCS).as_posix()}{anchor})"
        if RESULTS in path.parents and path.suffix.lower() in PICTURES:
            return f"{bang}[{text}](results/{path.relative_to(RESULTS).as_posix()})"
        where = path.relative_to(ROOT).as_posix() if ROOT in path.parents else target
        return f"{text} (`{where}`)" if text and text.strip("`") != where else f"`{where}`"

    return LINK.sub(mend, markdown)
