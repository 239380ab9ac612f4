"""Copy the kvembed modules a python-backend model imports into its Triton model directory.

Generated repositories are self-contained: each python-backend model carries the exact kvembed
code it runs, so Triton's python environment needs only the runtime's third-party packages
(numpy, onnxruntime, tokenizers), never a matching ``pip install kvembed``. Which modules to copy
is found by following the model file's import statements (module level, transitively, with every
parent package), so a runtime module that gains an import is still copied complete. Every module
of the rooms in :data:`WHOLE_ROOMS` is copied whatever the model imports: the runtime loads its
backends lazily (the OpenVINO and TensorRT-engine sessions), which the import walk cannot see. The
model files put their own directory first on ``sys.path``, so this copy wins over any installed kvembed.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path
from typing import Iterator

PACKAGE = Path(__file__).resolve().parents[1]  # .../kvembed
TOP = PACKAGE.name
#: rooms copied complete (those that exist): what the runtime may import lazily
WHOLE_ROOMS = ("artifact", "backends", "runtime")


def module_path(module: str) -> Path | None:
    """The source file of a ``kvembed...`` module or package, None if there is none."""
    parts = module.split(".")
    if parts[0] != TOP:
        return None
    base = PACKAGE.joinpath(*parts[1:])
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _module_level(nodes: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements run at import time: skip function bodies (lazy imports), enter if/try/class/with."""
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                yield from _module_level([child])
            elif isinstance(child, ast.ExceptHandler):
                yield from _module_level(child.body)


def imported_modules(path: Path, module: str) -> set[str]:
    """``kvembed`` modules that ``path`` (the module ``module``) imports at import time."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _module_level(ast.parse(path.read_text(encoding="utf-8")).body):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # submodules imported by name
    return {name for name in found if module_path(name) is not None}


def required_modules(entry: Path) -> set[str]:
    """Every kvembed module (and parent package) that importing the model file ``entry`` loads."""
    whole = sorted(
        ".".join((TOP, *path.relative_to(PACKAGE).with_suffix("").parts))
        for room in WHOLE_ROOMS for path in (PACKAGE / room).rglob("*.py") if path.stem != "__init__"
    )
    pending = sorted(imported_modules(entry, "__main__")) + whole
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        parts = name.split(".")
        for cut in range(1, len(parts) + 1):  # a module needs its parent packages
            parent = ".".join(parts[:cut])
            if parent not in seen:
                seen.add(parent)
                pending.extend(imported_modules(module_path(parent), parent) - seen)  # type: ignore[arg-type]
    return seen


def copy_runtime(entry: Path, target: Path) -> list[Path]:
    """Copy the modules ``entry`` needs under ``target/kvembed/``; returns the copied paths."""
    copied = []
    for module in sorted(required_modules(entry)):
        source = module_path(module)
        assert source is not None
        destination = target / source.relative_to(PACKAGE.parent)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)
        copied.append(destination)
    return copied
