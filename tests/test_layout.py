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


def kvembed_imports(folder: Path) -> list[tuple[str, str, str]]:
    """Every ``from kvembed... import NAME`` in the scripts below ``folder``: (file, module, name)."""
    import ast

    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("kvembed"):
                found += [(str(path.relative_to(ROOT)), node.module, alias.name) for alias in node.names]
    return found


def test_the_benchmarks_import_names_the_package_has() -> None:
    """A module moved in the package (export's sub-rooms, say) must take the benchmarks' imports
    with it: they run by hand, so nothing else would notice before a user does."""
    import importlib

    missing = []
    for file, module, name in kvembed_imports(ROOT / "benchmarks"):
        try:
            owner = importlib.import_module(module)
        except ImportError as err:
            missing.append(f"{file}: {module} ({err})")
            continue
        if name != "*" and not hasattr(owner, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{file}: {module}.{name}")
    assert len(kvembed_imports(ROOT / "benchmarks")) > 20  # the scan reads what it should
    assert not missing, missing
