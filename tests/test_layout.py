"""The src/ layout: Python started in the folder that holds a clone named ``kvembed`` imports the
installed package, not the clone's root as a namespace package (which has no ``Embedder``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_clone_named_kvembed_does_not_shadow_the_package(tmp_path: Path) -> None:
    clone = tmp_path / "kvembed"
    clone.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, clone / name)
    (clone / "tests").mkdir()  # a clone's root: folders, no __init__.py
    done = subprocess.run(
        [sys.executable, "-c", "import kvembed; from kvembed import Embedder; print(kvembed.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).name == "__init__.py" and not Path(done.stdout.strip()).is_relative_to(clone)
