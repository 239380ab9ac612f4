"""The machine a bundle is for: platform, CPython version and oldest glibc, in the two forms
that need it: pip's ``--platform/--python-version/--abi`` options, and the environment that
dependency markers are evaluated in (pip evaluates markers on the machine it runs on, not the
target, so :mod:`.wheelhouse` re-checks the closure with :meth:`Target.marker_environment`)."""

from __future__ import annotations

import platform
import re
import sys
from dataclasses import dataclass

from ..errors import InvalidInput

#: --platform value -> the machine name Python reports there (``platform.machine()``)
PLATFORMS: dict[str, str] = {"linux-x86_64": "x86_64", "linux-aarch64": "aarch64"}
#: the oldest glibc a bundle assumes unless told: manylinux_2_28 (RHEL 8, Debian 10+, Ubuntu 18.10+),
#: which onnxruntime's current wheels need anyway
DEFAULT_GLIBC = "2.28"
#: lowest manylinux glibc per machine (PEP 600): x86_64 wheels go back to manylinux1 (2.5),
#: aarch64 starts at manylinux2014 (2.17)
LOWEST_GLIBC_MINOR = {"x86_64": 5, "aarch64": 17}
#: PEP 599/571/513 names of the same glibc versions
LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


@dataclass(frozen=True)
class Target:
    platform: str  # linux-x86_64 | linux-aarch64
    python: str  # "3.11"
    glibc: str = DEFAULT_GLIBC

    @property
    def machine(self) -> str:
        return PLATFORMS[self.platform]

    @property
    def abi(self) -> str:
        return "cp" + self.python.replace(".", "")

    def describe(self) -> str:
        return f"{self.platform}, CPython {self.python}, glibc >= {self.glibc}"

    def pip_platforms(self) -> list[str]:
        """Every manylinux tag a host with this glibc runs, newest first: pip takes ``--platform``
        literally (it widens only the legacy aliases), so the older tags are listed out."""
        minor = int(self.glibc.split(".")[1])
        tags = []
        for m in range(minor, LOWEST_GLIBC_MINOR[self.machine] - 1, -1):
            tags.append(f"manylinux_2_{m}_{self.machine}")
            if m in LEGACY_MANYLINUX:  # aarch64 stops at 17: manylinux2014_aarch64 exists, the older names do not
                tags.append(f"{LEGACY_MANYLINUX[m]}_{self.machine}")
        return tags

    def pip_options(self) -> list[str]:
        """pip download/install options that select wheels for this target only."""
        options = ["--only-binary=:all:", "--python-version", self.python, "--implementation", "cp", "--abi", self.abi]
        for tag in self.pip_platforms():
            options += ["--platform", tag]
        return options

    def marker_environment(self) -> dict[str, str]:
        """PEP 508 marker variables on the target (patch level unknown: .0)."""
        full = f"{self.python}.0"
        return {
            "implementation_name": "cpython", "implementation_version": full, "os_name": "posix",
            "platform_machine": self.machine, "platform_python_implementation": "CPython",
            "platform_release": "", "platform_system": "Linux", "platform_version": "",
            "python_full_version": full, "python_version": self.python, "sys_platform": "linux",
        }

    def as_json(self) -> dict[str, object]:
        return {"platform": self.platform, "python": self.python, "implementation": "cp", "abi": self.abi,
                "glibc": self.glibc, "pip_platforms": self.pip_platforms()}


def this_platform() -> str | None:
    """This machine's --platform value, or None when it is not one a bundle can target."""
    if not sys.platform.startswith("linux"):
        return None
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
    return next((name for name, arch in PLATFORMS.items() if arch == machine), None)


def this_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def parse_target(platform_name: str | None, python: str | None, glibc: str | None) -> Target:
    """The target from the command line's options (defaults: this machine); ValueError says why not."""
    if platform_name is None:
        platform_name = this_platform()
        if platform_name is None:
            raise InvalidInput(f"this machine ({sys.platform} {platform.machine()}) is not a bundle target: "
                             f"give --platform ({' or '.join(PLATFORMS)})")
    if platform_name not in PLATFORMS:
        raise InvalidInput(f"--platform must be {' or '.join(PLATFORMS)}, got {platform_name!r}")
    python = this_python() if python is None else python.strip()
    if not re.fullmatch(r"3\.\d{1,2}", python):
        raise InvalidInput(f"--python must be a CPython 3.x version such as 3.11 or 3.12, got {python!r}")
    glibc = DEFAULT_GLIBC if glibc is None else glibc.strip()
    found = re.fullmatch(r"2\.(\d{1,2})", glibc)
    lowest = LOWEST_GLIBC_MINOR[PLATFORMS[platform_name]]
    if found is None or int(found.group(1)) < lowest:
        raise InvalidInput(f"--glibc must be a glibc version 2.{lowest} or newer for {platform_name} (e.g. 2.28), got {glibc!r}")
    return Target(platform_name, python, glibc)
