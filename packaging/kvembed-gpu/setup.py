"""The ``kvembed-gpu`` distribution: the package ``kvembed`` from this tree's ``src/``, with the
tree's ``pyproject.toml`` read for everything but the name and the runtime dependencies.

Why a second distribution: the modules of onnxruntime's CPU build (``onnxruntime``, kvembed's
dependency) and its GPU build (``onnxruntime-gpu``) share one folder, ``onnxruntime/``, so the
``gpu`` extra installed beside the core dependency leaves whichever was unpacked last, often the
CPU one. ``kvembed-gpu`` depends on ``onnxruntime-gpu`` alone (and on the ``cli`` extra's packages),
and its extras are kvembed's, minus ``gpu``. Wheel only: the sources live two folders up.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from setuptools import find_packages, setup

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
NAME, CPU_BUILD, GPU_BUILD = "kvembed-gpu", "onnxruntime", "onnxruntime-gpu"
#: a requirement's distribution name, as PEP 508 starts it
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def requirement_for_gpu(requirement: str) -> str | None:
    """``requirement`` as kvembed-gpu needs it: onnxruntime -> onnxruntime-gpu, ``kvembed[...]`` ->
    ``kvembed-gpu[...]``; None for ``kvembed[cli]`` (kvembed-gpu depends on the cli's packages)."""
    found = _NAME.match(requirement)
    name = found.group(1).lower() if found else ""
    rest = requirement[found.end():] if found else requirement
    if name == CPU_BUILD:
        return GPU_BUILD + rest
    if name == "kvembed":
        extras = [e.strip() for e in rest.strip().strip("[]").split(",") if e.strip() not in ("cli", "gpu", "")]
        return f"{NAME}[{','.join(extras)}]" if extras else None
    return requirement


def project_table() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def version() -> str:
    text = (ROOT / "src" / "kvembed" / "version.py").read_text(encoding="utf-8")
    return re.search(r'__version__\s*=\s*"([^"]+)"', text).group(1)


def arguments() -> dict:
    """``setup()``'s arguments, from the tree's pyproject.toml."""
    table = project_table()
    project, tool = table["project"], table["tool"]["setuptools"]
    optional = project.get("optional-dependencies", {})
    gpu = [r for r in map(requirement_for_gpu, project["dependencies"] + optional["cli"]) if r]
    extras = {name: [r for r in map(requirement_for_gpu, requirements) if r]
              for name, requirements in optional.items() if name not in ("cli", "gpu")}
    source = ROOT / "src"
    return dict(
        name=NAME,
        version=version(),
        description=project["description"] + " (GPU build: onnxruntime-gpu)",
        long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
        long_description_content_type="text/markdown",
        license=project.get("license"),
        python_requires=project["requires-python"],
        install_requires=gpu,
        extras_require=extras,
        packages=find_packages(where=str(source), include=tool["packages"]["find"]["include"]),
        package_dir={"": "../../src"},  # relative: setuptools takes no absolute package folder
        package_data=tool["package-data"],
        entry_points={"console_scripts": [f"{k} = {v}" for k, v in project["scripts"].items()]},
        # the egg-info here, not in the tree's src/ (where it would name kvembed-gpu installed)
        options={"egg_info": {"egg_base": str(HERE)}},
    )


setup(**arguments())
