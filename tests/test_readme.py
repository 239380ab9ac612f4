"""README's commands run as written, in order: every artifact or input file a command names was
written by a command above it, and no command holds a placeholder (ARTIFACT, DIR, ...).

A static check of README.md's ```bash blocks (running them all would take CI minutes: the
Quickstart's are run by .ci/run itself). The rule and the checker are tests/doc_commands.py's,
shared with the docs pages (tests/test_docs.py)."""

from __future__ import annotations

import shlex

from doc_commands import ROOT, check_commands, commands, paths_named


def test_every_readme_command_reads_only_what_an_earlier_one_wrote():
    problems, _ = check_commands(commands((ROOT / "README.md").read_text(encoding="utf-8")))
    assert not problems, "\n".join(problems)


def test_the_check_finds_an_artifact_nothing_wrote():
    made, used = paths_named(shlex.split("kvembed serve artifacts/never-made --port 8080"))
    assert used == ["artifacts/never-made"] and made == []
    problems, _ = check_commands(["kvembed embed artifacts/never-made hi"])
    assert problems and "never-made" in problems[0]
