"""The bundle's scripts, unit, Dockerfile and README: files in ``templates/`` (shipped as package
data, so shellcheck-able and hadolint-able as they are) with ``@@NAME@@`` placeholders."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Mapping

#: template -> (file name in the bundle, mode); dockerignore is stored without its dot because
#: package-data globs skip dot files
TEMPLATES: dict[str, tuple[str, int]] = {
    "install.sh": ("install.sh", 0o755), "run.sh": ("run.sh", 0o755), "kvembed.env": ("kvembed.env", 0o644),
    "kvembed.service": ("kvembed.service", 0o644), "Dockerfile": ("Dockerfile", 0o644),
    "dockerignore": (".dockerignore", 0o644), "README.md": ("README.md", 0o644),
}
PLACEHOLDER = re.compile(r"@@([A-Z_]+)@@")


def fill(text: str, values: Mapping[str, str]) -> str:
    """Replace every ``@@NAME@@``; a placeholder without a value is a bug, not a silent blank."""
    def value(found: re.Match[str]) -> str:
        if found.group(1) not in values:
            raise KeyError(f"bundle template placeholder @@{found.group(1)}@@ has no value")
        return values[found.group(1)]

    return PLACEHOLDER.sub(value, text)


def template_values(*, models: list[str], target_platform: str, machine: str, python: str, target: str,
                    prefix: str, bundle_name: str, kvembed_version: str, extras: list[str],
                    wheel_count: int, wheelhouse_bytes: int, signed: bool = False) -> dict[str, str]:
    """Every placeholder's text. Model names are plain (``[A-Za-z0-9._-]``), so they need no quoting."""
    entrypoint = ["kvembed", "serve", *[f"/opt/kvembed/artifacts/{m}" for m in models], "--host", "0.0.0.0", "--port", "8080"]
    return {
        "MODELS": ", ".join(models), "FIRST_MODEL": models[0], "PLATFORM": target_platform, "MACHINE": machine,
        "PYTHON": python, "TARGET": target, "PREFIX": prefix, "BUNDLE_NAME": bundle_name,
        "KVEMBED_VERSION": kvembed_version, "EXTRAS": ", ".join(extras),
        "WHEEL_COUNT": str(wheel_count), "WHEELHOUSE_MB": f"{wheelhouse_bytes / 1e6:.0f}",
        "ARTIFACTS_SH": " ".join(f'"$HERE/artifacts/{m}"' for m in models),
        "ARTIFACTS_UNIT": " ".join(f"{prefix}/artifacts/{m}" for m in models),
        "DOCKER_ENTRYPOINT": json.dumps(entrypoint),
        "SIGNED": "yes" if signed else "no",
    }


def write_templates(directory: Path, values: Mapping[str, str]) -> list[str]:
    """Write every template into ``directory``; returns the names written."""
    root = resources.files("kvembed.bundle").joinpath("templates")
    for template, (name, mode) in TEMPLATES.items():
        path = directory / name
        path.write_text(fill(root.joinpath(template).read_text(encoding="utf-8"), values), encoding="utf-8")
        path.chmod(mode)
    return [name for name, _ in TEMPLATES.values()]
