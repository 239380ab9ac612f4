"""The wheelhouse: kvembed's own wheel plus every wheel its runtime and extras need on the target,
chosen by pip's resolver (``pip download --only-binary=:all: --platform ...``), never copied from
this machine's site-packages.

pip evaluates dependency markers (``python_version < "3.11"``, ``platform_machine == ...``) on the
machine it runs on, not on the target, so after each download the closure is re-walked with the
target's marker environment: what the target needs and pip left out is downloaded in another round,
what only this machine would need is dropped. The result is checked wheel by wheel against the
target's tags and its Requires-Python against the target's Python (pip before 23.3 judges that by
the interpreter running it, pypa/pip#12216), and must not hold torch (the runtime is torch-free by contract).
"""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from ..version import __version__
from ..errors import InvalidInput, KvembedError
from ..artifact import sha256_file
from .target import Target

#: packages that must never reach a bundle: torch and what only torch brings
FORBIDDEN = frozenset({"torch", "torchvision", "torchaudio", "triton"})
#: rounds of "download what the target's markers add" before giving up
MAX_ROUNDS = 5
#: pip output that means the index was not reached (not that a wheel is missing)
UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Network is unreachable|Name or service not known|"
    r"Temporary failure in name resolution|Connection refused|ConnectTimeoutError|ProxyError|Max retries exceeded"
)
REQUIREMENTS = "requirements.txt"


class BundleError(KvembedError):
    """The bundle cannot be built for this target (the message names the package and the reason)."""


@dataclass
class Wheel:
    """One wheel file of the wheelhouse and what its METADATA says."""

    path: Path
    name: str  # canonical (PEP 503)
    version: str
    requires: list[str] = field(default_factory=list)
    #: the METADATA's Requires-Python ("" when it names none)
    requires_python: str = ""

    def record(self) -> dict[str, object]:
        return {"file": self.path.name, "name": self.name, "version": self.version,
                "sha256": sha256_file(self.path), "bytes": self.path.stat().st_size}


def run_pip(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m pip ARGS`` with this interpreter, output captured (for :func:`explain_failure`)."""
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "PIP_PROGRESS_BAR": "off"}
    try:
        return subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    except FileNotFoundError as err:  # pragma: no cover - sys.executable vanished
        raise BundleError(f"cannot run pip with {sys.executable}: {err}") from None


def explain_failure(output: str, target: Target) -> str:
    """pip's failure as one line: which package has no wheel for the target (and the newest that
    pip saw), a Python version a package refuses, an unreachable index, or pip's first error."""
    if UNREACHABLE.search(output) and "(from versions: none)" in output:
        return unreachable(output)
    found = re.search(r"Could not find a version that satisfies the requirement (\S+)(?: \(from ([^)]*)\))?"
                      r"(?: \(from versions: ([^)]*)\))?", output)
    if found:
        requirement, needed_by, versions = found.groups()
        name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]
        by = f", needed by {needed_by.split('==')[0]}" if needed_by else ""
        seen = [v.strip() for v in (versions or "").split(",") if v.strip() and v.strip() != "none"]
        others = (f"; the newest {name} wheel for this target is {seen[-1]}, which {requirement} excludes" if seen
                  else f"; no {name} wheel at all matches this target")
        return f"{name} has no wheel for {target.describe()} ({requirement}{by}){others}"
    found = re.search(r"Package '([^']+)' requires a different Python: (\S+) not in '([^']+)'", output)
    if found:
        name, _, wanted = found.groups()
        return f"{name} needs Python {wanted}; the target is CPython {target.python} (choose --python accordingly)"
    return f"pip could not resolve the wheels for {target.describe()}: {_first_error(output)}"


def unreachable(output: str) -> str:
    return (f"the package index could not be reached (pip: {_first_error(output)}); kvembed bundle downloads "
            "the wheels for the target, so it needs the index (or a mirror in pip's config)")


def _first_error(output: str) -> str:
    for line in output.splitlines():
        if line.startswith("ERROR:"):
            return line[len("ERROR:"):].strip()
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def source_tree() -> Path | None:
    """The kvembed checkout this package is imported from (None when installed from a wheel)."""
    root = Path(__file__).resolve().parents[3]  # <root>/src/kvembed/bundle/wheelhouse.py
    project = root / "pyproject.toml"
    if project.is_file() and re.search(r'(?m)^name\s*=\s*"kvembed"\s*$', project.read_text(encoding="utf-8")):
        return root
    return None


def build_own_wheel(dest: Path, given: Path | None = None) -> Path | None:
    """kvembed's wheel in ``dest``: the one given, or built with ``pip wheel --no-deps`` from a
    copy of the checkout (so the build writes nothing into it); None when kvembed is installed
    from a wheel and none was given (then pip downloads ``kvembed==VERSION`` like the rest)."""
    if given is not None:
        if not given.is_file() or not re.fullmatch(r"kvembed-[^-]+-py3-none-any\.whl", given.name):
            raise InvalidInput(f"--kvembed-wheel must be a kvembed-VERSION-py3-none-any.whl file, got {str(given)!r}")
        return Path(shutil.copy2(given, dest / given.name))
    root = source_tree()
    if root is None:
        return None
    with tempfile.TemporaryDirectory(prefix="kvembed-wheel-") as tmp:
        copy = Path(tmp) / "src"
        copy.mkdir()
        for item in root.iterdir():
            if item.is_file():
                shutil.copy2(item, copy / item.name)
        shutil.copytree(root / "src" / "kvembed", copy / "src" / "kvembed", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        done = run_pip(["wheel", "--no-deps", "--wheel-dir", str(dest), str(copy)])
        if done.returncode != 0:  # build isolation fetches setuptools from the index
            raise BundleError(unreachable(done.stdout) if UNREACHABLE.search(done.stdout)
                              else f"building kvembed's wheel failed: {_first_error(done.stdout)}")
    built = sorted(dest.glob("kvembed-*.whl"))
    if len(built) != 1:
        raise BundleError(f"pip wheel left {len(built)} kvembed wheels in {dest}")
    return built[0]


def download(requirements: Iterable[str], target: Target, dest: Path) -> None:
    """``pip download`` the requirements and their dependencies for the target into ``dest``."""
    done = run_pip(["download", *target.pip_options(), "--dest", str(dest), *requirements])
    if done.returncode != 0:
        raise BundleError(explain_failure(done.stdout, target))


def read_wheel(path: Path) -> Wheel:
    """Name, version and Requires-Dist of a wheel, from its METADATA."""
    from packaging.utils import canonicalize_name, parse_wheel_filename

    name, _, _, _ = parse_wheel_filename(path.name)
    with zipfile.ZipFile(path) as archive:
        metadata = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
        if metadata is None:
            raise BundleError(f"{path.name} has no .dist-info/METADATA: not a wheel")
        message = email.parser.Parser().parsestr(archive.read(metadata).decode("utf-8"), headersonly=True)
    return Wheel(path, canonicalize_name(name), message["Version"], message.get_all("Requires-Dist") or [],
                 (message.get("Requires-Python") or "").strip())


def check_fits(wheel: Wheel, target: Target) -> None:
    """Refuse a wheel that would not install on the target, by its tags or its Requires-Python (pip
    chose it; this guards the rest, whatever pip's version)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.tags import compatible_tags, cpython_tags
    from packaging.utils import parse_wheel_filename

    version = tuple(int(part) for part in target.python.split("."))
    platforms = target.pip_platforms()
    supported = {*cpython_tags(version, [target.abi], platforms), *compatible_tags(version, target.abi, platforms)}
    if not set(parse_wheel_filename(wheel.path.name)[3]) & supported:
        raise BundleError(f"{wheel.path.name} does not install on {target.describe()}")
    if wheel.requires_python:
        try:
            admits = SpecifierSet(wheel.requires_python).contains(target.marker_environment()["python_full_version"])
        except InvalidSpecifier:
            raise BundleError(f"{wheel.path.name} has an unreadable Requires-Python {wheel.requires_python!r}") from None
        if not admits:
            raise BundleError(f"{wheel.path.name} needs Python {wheel.requires_python}; the target is CPython {target.python} "
                              "(choose --python accordingly)")


def closure(wheels: dict[str, list[Wheel]], root: str, target: Target) -> tuple[dict[str, Wheel], list[str]]:
    """What ``root`` needs on the target, walked with the target's markers: the wheels chosen (the
    newest that satisfies every requirement seen) and the requirements no wheel here satisfies."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    environment = target.marker_environment()
    chosen: dict[str, Wheel] = {}
    extras_done: dict[str, set[str]] = {}
    specs: dict[str, list[Requirement]] = {}
    missing: list[str] = []
    queue = [Requirement(root)]
    while queue:
        requirement = queue.pop()
        name = canonicalize_name(requirement.name)
        specs.setdefault(name, []).append(requirement)
        fits = [w for w in wheels.get(name, []) if all(r.specifier.contains(w.version, prereleases=True) for r in specs[name])]
        if not fits:
            missing.append(str(requirement).split(";")[0].strip())
            continue
        best = max(fits, key=lambda w: _version(w.version))
        extras = set(requirement.extras)
        if chosen.get(name) is best and extras <= extras_done[name]:
            continue
        chosen[name] = best
        extras_done[name] = extras_done.get(name, set()) | extras
        for line in best.requires:
            dependency = Requirement(line)
            wanted = dependency.marker is None or any(
                dependency.marker.evaluate({**environment, "extra": extra}) for extra in ("", *extras_done[name]))
            if wanted:
                queue.append(dependency)
    return chosen, sorted(set(missing))


def _version(text: str) -> object:
    from packaging.version import Version

    return Version(text)


def resolve(wheelhouse: Path, root: str, target: Target) -> list[Wheel]:
    """Fill ``wheelhouse`` with exactly the wheels ``root`` (e.g. ``kvembed[serve]==0.1.0``) needs
    on the target: pip downloads, the target's markers decide; BundleError names what is missing."""
    download([root], target, wheelhouse)
    for _ in range(MAX_ROUNDS):
        wheels: dict[str, list[Wheel]] = {}
        for path in sorted(wheelhouse.glob("*.whl")):
            wheel = read_wheel(path)
            wheels.setdefault(wheel.name, []).append(wheel)
        chosen, missing = closure(wheels, root, target)
        if not missing:
            break
        download(missing, target, wheelhouse)  # what the target's markers add; pip names any that has no wheel
    else:
        raise BundleError(f"the wheels for {target.describe()} did not settle after {MAX_ROUNDS} rounds: still missing {', '.join(missing)}")
    forbidden = sorted(FORBIDDEN & set(chosen))
    if forbidden:
        raise BundleError(f"the bundle would hold {', '.join(forbidden)}: the runtime and the server are torch-free, "
                          "so an extra brought it in; drop that --with")
    keep = {w.path for w in chosen.values()}
    for path in wheelhouse.iterdir():
        if path not in keep:  # what only this machine's markers asked for, or other files pip left
            path.unlink()
    for wheel in chosen.values():
        check_fits(wheel, target)
    return sorted(chosen.values(), key=lambda w: w.name)


def write_requirements(wheelhouse: Path, wheels: list[Wheel], root_name: str, extras: list[str]) -> Path:
    """``requirements.txt``: every wheel pinned with its sha256, for ``pip install --require-hashes``
    on the target (a damaged or swapped wheel is refused there)."""
    lines = []
    for wheel in wheels:
        spec = f"{wheel.name}[{','.join(extras)}]" if wheel.name == root_name and extras else wheel.name
        lines.append(f"{spec}=={wheel.version} --hash=sha256:{sha256_file(wheel.path)}")
    path = wheelhouse / REQUIREMENTS
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def root_requirement(extras: list[str], own_wheel: Path | None) -> str:
    """What pip resolves: the built wheel's file with extras, or ``kvembed[...]==VERSION`` from the index."""
    suffix = f"[{','.join(extras)}]" if extras else ""
    if own_wheel is not None:
        return f"kvembed{suffix} @ {own_wheel.resolve().as_uri()}"
    return f"kvembed{suffix}=={__version__}"
