"""mkdocs hook: the families and trained embedders tables (``kvembed.methods.families``) where a
page says ``<!-- families -->``, so the site's table is the architecture table's own.

Run as a script, it writes the same tables into README.md between ``<!-- families:start -->`` and
``<!-- families:end -->`` (tests/test_families_table.py fails while README's differ).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

MARKER = "<!-- families -->"
README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"(<!-- families:start -->\n).*?(<!-- families:end -->)", re.S)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from kvembed.methods.families import tables_markdown

    return markdown.replace(MARKER, tables_markdown())


def readme_with_tables(text: str) -> str:
    """README's text with its families block made anew."""
    from kvembed.methods.families import tables_markdown

    if not BLOCK.search(text):
        raise ValueError("README.md has no <!-- families:start --> ... <!-- families:end --> block")
    return BLOCK.sub(lambda m: m.group(1) + tables_markdown() + "\n" + m.group(2), text)


if __name__ == "__main__":
    README.write_text(readme_with_tables(README.read_text(encoding="utf-8")), encoding="utf-8")
    sys.stdout.write(f"wrote the families tables into {README}\n")
