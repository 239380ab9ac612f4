"""The command line as installed, run as a new user would: ``python tests/cli_smoke.py ARTIFACT``.

Runs in whatever environment starts it (a venv holding only some of kvembed's extras): every
program's and every subcommand's ``--help`` exits 0, ``--version`` prints the version, ``kvembed embed ARTIFACT`` embeds, and each
command whose extra is missing here exits 2 with one line naming that extra (no traceback).
.ci/run calls it after README's first Quickstart command; tests/test_wheel.py calls it in a venv
of the wheel with the ``cli`` extra only. Exits 1, listing every failure, if anything is off.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

#: a command that needs an extra, with arguments that get it past option parsing: (extra, argv)
NEEDS_EXTRA: tuple[tuple[str, str, list[str]], ...] = (
    ("serve", "fastapi", ["kvembed", "serve", "{artifact}"]),
    ("corpus", "pyarrow", ["kvembed", "embed-corpus", "{artifact}", "--input", "{texts}", "--output", "{out}"]),
    ("eval", "mteb", ["kvembed", "eval", "{artifact}", "--task", "sample", "--out", "{out}"]),
    ("export", "torch", ["kvembed", "embed", "--model", "stories260k", "hello"]),
    ("export", "transformers", ["kvembed", "verify", "{artifact}"]),
    ("triton", "tritonclient", ["kvembed", "triton", "build", "{artifact}", "--out", "{out}"]),
    ("openvino", "openvino", ["kvembed", "embed", "{artifact}", "--provider", "openvino", "hello"]),
    ("bundle", "packaging", ["kvembed", "bundle", "{artifact}", "--out", "{out}"]),
)


def command_paths() -> list[list[str]]:
    """Every program and subcommand the package installs, read from the typer apps themselves."""
    import typer

    from kvembed.cli.main import app

    def walk(group: typer.Typer, prefix: list[str]) -> list[list[str]]:
        paths = [prefix]
        for info in group.registered_commands:
            if not info.hidden:  # ``kvembed export``'s default command runs as ``kvembed export``
                paths.append(prefix + [info.name or info.callback.__name__.replace("_", "-")])
        for sub in group.registered_groups:
            paths += walk(sub.typer_instance, prefix + [sub.name])
        return paths

    return walk(app, ["kvembed"]) + [["kvembed-export"], ["kvembed-export", "verify"], ["kvembed-layers"]]


def run(argv: list[str]) -> subprocess.CompletedProcess:
    program = shutil.which(argv[0], path=str(Path(sys.executable).parent)) or argv[0]
    # no slow-step status lines: on a loaded machine a step may pass the display's threshold, and
    # what is checked here is the commands' own output (their stderr must be one line)
    env = {"COLUMNS": "80", "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "KVEMBED_STATUS_AFTER": "inf"}
    return subprocess.run([program, *argv[1:]], capture_output=True, text=True, timeout=600, env=env)


def check(artifact: Path, scratch: Path) -> list[str]:
    problems: list[str] = []
    for path in command_paths():
        done = run([*path, "--help"])
        if done.returncode != 0 or "Traceback" in done.stderr or "Usage:" not in done.stdout:
            problems.append(f"{' '.join(path)} --help: exit {done.returncode}: {done.stderr.strip()[-300:]}")
    for program in ("kvembed", "kvembed-export", "kvembed-layers"):
        done = run([program, "--version"])
        if done.returncode != 0 or not done.stdout.startswith("kvembed "):
            problems.append(f"{program} --version: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}")
    done = run(["kvembed", "embed", str(artifact), "--similarity", "A cat sat on the mat.", "A kitten sat on a rug."])
    if done.returncode != 0 or "cosine similarity" not in done.stdout:
        problems.append(f"kvembed embed {artifact}: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}")
    texts = scratch / "texts.txt"
    texts.write_text("hello\n", encoding="utf-8")
    for extra, module, argv in NEEDS_EXTRA:
        if importlib.util.find_spec(module) is not None:
            continue  # installed here: nothing to check
        argv = [a.format(artifact=artifact, texts=texts, out=scratch / f"out-{extra}") for a in argv]
        done = run(argv)
        lines = done.stderr.strip().splitlines()
        if done.returncode != 2 or len(lines) != 1 or f"kvembed[{extra}]" not in lines[0]:
            problems.append(f"{' '.join(argv[:2])} without {module}: exit {done.returncode}, want 2 and one line naming "
                            f"kvembed[{extra}]: {done.stderr.strip()[-300:]}")
    return problems


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        found = check(Path(sys.argv[1]), Path(scratch))
    for problem in found:
        print(f"cli_smoke: {problem}", file=sys.stderr)
    print(f"cli_smoke: {'FAILED' if found else 'ok'}: {len(command_paths())} programs/commands")
    sys.exit(1 if found else 0)
