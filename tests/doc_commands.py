"""The commands of README.md and the docs pages, read as a user reads them, and the static check
that each command reads only what an earlier one wrote.

The rule, for README.md and every docs page: a command reads only paths that exist in the
checkout or that an earlier command wrote; on a docs page "earlier" means earlier on the same page,
or anywhere on docs/getting-started.md, which every guide builds on. No command holds a
placeholder (ARTIFACT, DIR, ...): every command runs as written.

A command that cannot run in the tests says so at the end of its line:
``# not run in tests: <why>`` (a hub download, a GPU, a server that blocks, a package index).
Environment setup (``pip install``, ``python3 -m venv``, activating a venv) is not run either: the
tests' environment is already set up. Everything else on a page that uses the demo model runs in
tests/test_docs.py.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from kvembed.methods.models import ALIASES, PACKAGED

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GETTING_STARTED = DOCS / "getting-started.md"
#: options whose value a command writes
WRITES = {"--out", "-o", "--output", "--local-dir"}
#: options whose value a command reads
READS = {"--input", "-i", "--artifact", "--encoder", "--llm", "--model", "--baseline"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]{2,}$")
#: what ``--model`` takes that is no path: kvembed's aliases (``qwen3-embedding-0.6b`` has a dot)
MODEL_NAMES = frozenset({*ALIASES, *PACKAGED})
#: the marker of a command the tests do not run, with the reason
NOT_RUN = re.compile(r"#\s*not run in tests:\s*(?P<why>\S.*)$")
#: environment setup: the tests' venv has done it
SETUP = re.compile(r"^\s*(pip3? install|python3?(\.\d+)? -m venv|\. \S+/activate|source \S+/activate)\b")
BLOCK = re.compile(r"```(?P<lang>bash|python)\n(?P<body>.*?)```", re.S)


@dataclass(frozen=True)
class Snippet:
    """One bash command (continuation lines joined) or one python block of a page."""

    lang: str
    text: str
    #: why the tests do not run it (the marker's reason), or None
    not_run: str | None

    @property
    def setup(self) -> bool:
        return self.lang == "bash" and all(SETUP.match(part) for part in re.split(r"&&|;", self.text) if part.strip())

    @property
    def runs(self) -> bool:
        return self.not_run is None and not self.setup


def snippets(text: str) -> list[Snippet]:
    """Every bash command and python block of a markdown text, in order."""
    found: list[Snippet] = []
    for block in BLOCK.finditer(text):
        body = block.group("body")
        if block.group("lang") == "python":
            first = body.lstrip().splitlines()[0] if body.strip() else ""
            marker = NOT_RUN.search(first)
            found.append(Snippet("python", body, marker.group("why") if marker else None))
            continue
        for line in re.sub(r"\\\n", " ", body).splitlines():
            if shlex.split(line, comments=True):
                marker = NOT_RUN.search(line)
                found.append(Snippet("bash", line.strip(), marker.group("why") if marker else None))
    return found


def commands(text: str) -> list[str]:
    """Every bash command of a markdown text, comments dropped, words re-quoted."""
    return [" ".join(shlex.quote(w) for w in shlex.split(s.text, comments=True)) for s in snippets(text) if s.lang == "bash"]


def simple_commands(command: str) -> list[list[str]]:
    """The words of each simple command of a pipeline or list (``a && b | c``)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars="|&;")
    lexer.whitespace_split = True
    parts: list[list[str]] = [[]]
    for word in lexer:
        if word in {"&&", "|", ";", "||"}:
            parts.append([])
        else:
            parts[-1].append(word)
    return [p for p in parts if p]


def paths_named(words: list[str]) -> tuple[list[str], list[str]]:
    """(written, read) paths of one simple command."""
    written: list[str] = []
    read: list[str] = []
    for i, word in enumerate(words):
        before = words[i - 1] if i else ""
        if before in WRITES or before == ">":
            written.append(word)
        elif before in READS and word != "-" and ("/" in word or "." in word) and word.lower() not in MODEL_NAMES:
            read.append(word)
        elif word.startswith("artifacts/") or "=artifacts/" in word:
            read.append(word.split("=", 1)[-1])
    return written, read


def quoted_writes(words: list[str]) -> list[str]:
    """Folders a ``python -c`` one-liner names as a quoted argument (``extract_model('models')``)."""
    if words[:2] != ["python", "-c"] or len(words) < 3:
        return []
    return re.findall(r"\('([\w./-]+)'\)", words[2])


def check_commands(lines: list[str], written: set[str] | None = None, where: str = "") -> tuple[list[str], set[str]]:
    """(problems, paths written) of ``lines`` run in order after commands that wrote ``written``."""
    written = set(written or ())
    problems: list[str] = []
    for command in lines:
        for words in simple_commands(command):
            made, used = paths_named(words)
            placeholders = [w for w in words if PLACEHOLDER.match(w.split("=", 1)[-1])]
            if placeholders and not words[0].isupper() and "=" not in words[0]:
                problems.append(f"{where}placeholder {placeholders} in: {' '.join(words)}")
            for path in used:
                norm = path.rstrip("/")
                if norm not in written and not (ROOT / norm).exists() and not any(
                        norm.startswith(w.rstrip("/") + "/") for w in written):
                    problems.append(f"{where}{path!r} is read before any command writes it: {' '.join(words)}")
            written.update(p.rstrip("/") for p in made)
            written.update(quoted_writes(words))
    return problems, written


def doc_pages() -> list[Path]:
    """Every markdown page of the docs site, getting-started.md first."""
    pages = sorted(DOCS.rglob("*.md"))
    return [GETTING_STARTED, *(p for p in pages if p != GETTING_STARTED)]
