"""kvembed as a new user installs it: a fresh venv with only the ``cli`` extra (no torch, no
FastAPI, no pyarrow) runs every command's ``--help`` and ``kvembed embed`` on an artifact, and a
command whose extra is missing exits 2 with one line naming it (tests/cli_smoke.py does the
checking; .ci/run runs the same script after README's first Quickstart command)."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_cli_extra_alone_runs_every_help_and_embed(stories_artifact, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", f"{ROOT}[cli]"],
                             capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-2000:]
    absent = subprocess.run([str(python), "-c", "import importlib.util as u; print([m for m in ('torch', 'fastapi', 'pyarrow') if u.find_spec(m)])"],
                            capture_output=True, text=True)
    assert absent.stdout.strip() == "[]", "the cli extra alone must not bring torch, fastapi or pyarrow"
    smoke = subprocess.run([str(python), str(ROOT / "tests" / "cli_smoke.py"), str(stories_artifact("kv-embedding"))],
                           capture_output=True, text=True, timeout=900)
    assert smoke.returncode == 0, smoke.stderr[-4000:]
    assert "cli_smoke: ok" in smoke.stdout
