"""README's commands run as written, in order: every artifact or input file a command names was
written by a command above it, and no command holds a placeholder (ARTIFACT, DIR, ...).

A static check of README.md's ```bash blocks (running them all would take CI minutes: the
Quickstart's are run by .ci/run itself)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: options whose value a command writes
WRITES = {"--out", "-o", "--output"}
#: options whose value a command reads
READS = {"--input", "-i", "--artifact", "--encoder", "--llm", "--model", "--baseline"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]{2,}$")


def readme_commands() -> list[str]:
    """Every command of README's ```bash blocks, continuation lines joined, comments dropped."""
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S):
        for command in re.sub(r"\\\n", " ", block).splitlines():
            words = shlex.split(command, comments=True)
            if words:
                commands.append(" ".join(shlex.quote(w) for w in words))
    return commands


def simple_commands(command: str) -> list[list[str]]:
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
        elif before in READS and word != "-" and ("/" in word or "." in word):
            read.append(word)
        elif word.startswith("artifacts/") or "=artifacts/" in word:
            read.append(word.split("=", 1)[-1])
    return written, read


def quoted_writes(words: list[str]) -> list[str]:
    """Folders a ``python -c`` one-liner names as a quoted argument (``extract_model('models')``)."""
    if words[:2] != ["python", "-c"] or len(words) < 3:
        return []
    return re.findall(r"\('([\w./-]+)'\)", words[2])


def test_every_readme_command_reads_only_what_an_earlier_one_wrote():
    written: set[str] = set()
    problems: list[str] = []
    for command in readme_commands():
        for words in simple_commands(command):
            made, used = paths_named(words)
            placeholders = [w for w in words if PLACEHOLDER.match(w.split("=", 1)[-1])]
            if placeholders and not words[0].isupper() and "=" not in words[0]:
                problems.append(f"placeholder {placeholders} in: {' '.join(words)}")
            for path in used:
                norm = path.rstrip("/")
                if norm not in written and not (ROOT / norm).exists() and not any(
                        norm.startswith(w.rstrip("/") + "/") for w in written):
                    problems.append(f"{path!r} is read before any README command writes it: {' '.join(words)}")
            written.update(p.rstrip("/") for p in made)
            written.update(quoted_writes(words))
    assert not problems, "\n".join(problems)


def test_the_check_finds_an_artifact_nothing_wrote():
    made, used = paths_named(shlex.split("kvembed serve artifacts/never-made --port 8080"))
    assert used == ["artifacts/never-made"] and made == []
