"""One bundle, written whole or not at all: everything goes into a staging directory beside
``--out`` (:func:`kvembed.artifact.staging.staged`) that is renamed into place only once the wheelhouse
resolved, every artifact re-hashed and every file was written; the ``.tar.gz`` likewise appears
under its name only after the directory did."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shutil
import sys
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..version import __version__
from ..artifact import sha256_file
from .artifacts import add_artifact, parse_artifact_argument
from .render import template_values, write_templates
from .target import Target
from .wheelhouse import BundleError, build_own_wheel, resolve, root_requirement, run_pip, write_requirements
from ..errors import InvalidInput

BUNDLE_SCHEMA = 1
MANIFEST = "bundle.json"
SUMS = "SHA256SUMS"
#: files the operator edits on the host (settings and key, install path): not in SHA256SUMS
EDITABLE = frozenset({"kvembed.env", "kvembed.service"})
#: --with NAME -> the kvembed extra it adds to the wheelhouse (serve is always in)
WITH_EXTRAS = {"openvino": "openvino", "triton": "triton"}
DEFAULT_PREFIX = "/opt/kvembed"
#: a bundle built with ``--trust-key``: the public key its install.sh checks every artifact's signature with
TRUST_KEY = "trust.pem"

Progress = Callable[[str], None]


@dataclass
class BundleResult:
    path: Path
    tarball: Path | None
    manifest: dict[str, Any]


def extras_for(with_: list[str], signed: bool = False) -> list[str]:
    """The kvembed extras of the wheelhouse: serve, those of ``--with``, and sign for a bundle
    built with a trust key (its install.sh checks the signatures)."""
    unknown = sorted(set(with_) - set(WITH_EXTRAS))
    if unknown:
        raise InvalidInput(f"--with takes {' or '.join(WITH_EXTRAS)}, got {', '.join(map(repr, unknown))}")
    return ["serve", *sorted({WITH_EXTRAS[name] for name in with_} | ({"sign"} if signed else set()))]


def tarball_path(out: Path) -> Path:
    return out.with_name(out.name + ".tar.gz")


def build_bundle(artifacts: list[str], out: Path, target: Target, *, with_: Sequence[str] = (), tar: bool = False,
                 force: bool = False, prefix: str = DEFAULT_PREFIX, kvembed_wheel: Path | None = None,
                 progress: Progress | None = None, trust_key: Path | None = None) -> BundleResult:
    """Write the bundle for ``target`` at ``out`` (and ``out.tar.gz`` with ``tar``).

    ``trust_key``: a PEM public key every artifact must be signed with (``kvembed sign``): each
    bundled copy is checked with it, the key travels as ``trust.pem``, the wheelhouse gets the
    ``sign`` extra, and ``install.sh`` checks every artifact's signature with the installed kvembed."""
    say = progress or (lambda message: None)
    import packaging.requirements  # noqa: F401  (without the bundle extra: fail now, naming it, not after the download)

    from ..artifact.signing import verify_signature
    from ..artifact.staging import staged

    if not artifacts:
        raise InvalidInput("give at least one artifact directory (kvembed bundle ARTIFACT... --out DIR)")
    named = [parse_artifact_argument(a) for a in artifacts]
    names = [name for name, _, _ in named]
    if len(set(names)) != len(names):
        raise InvalidInput(f"two artifacts are named {sorted({n for n in names if names.count(n) > 1})[0]!r}: name them NAME=DIR")
    extras = extras_for(list(with_), signed=trust_key is not None)
    if not re.fullmatch(r"/[A-Za-z0-9._/-]*", prefix):
        raise InvalidInput(f"--prefix must be an absolute path of plain characters, got {prefix!r}")
    out = Path(out).expanduser()
    targets = [out, *([tarball_path(out)] if tar else [])]
    for path in targets:
        if path.exists() and not force and not (path.is_dir() and not any(path.iterdir())):
            raise FileExistsError(f"{path} exists: choose another --out or add --force to replace it")
    for _, directory, _ in named:
        if out.resolve() == directory.resolve() or out.resolve() in directory.resolve().parents:
            raise InvalidInput(f"--out {out} would replace the artifact {directory}")

    pip_version = _pip_version()  # no pip, no bundle: say so before any work
    pending_tar: Path | None = None
    try:
        with staged(out) as staging:
            records = {}
            for name, directory, manifest in named:  # first: a damaged artifact fails before any download
                say(f"adding artifact {name} ({directory})")
                if trust_key is not None:  # before any download
                    verify_signature(directory, trust_key)
                records[name] = add_artifact(directory, staging / "artifacts" / name, manifest)
                if trust_key is not None:  # and the copy that ships
                    try:
                        verify_signature(staging / "artifacts" / name, trust_key)
                    except InvalidInput as err:
                        raise InvalidInput(f"artifact {str(directory)!r} changed while it was bundled: {err}") from None
            if trust_key is not None:
                shutil.copyfile(trust_key, staging / TRUST_KEY)
            wheelhouse = staging / "wheelhouse"
            wheelhouse.mkdir()
            say("building kvembed's wheel")
            own = build_own_wheel(wheelhouse, kvembed_wheel)
            say(f"resolving the wheelhouse for {target.describe()} (pip download)")
            wheels = resolve(wheelhouse, root_requirement(extras, own), target)
            write_requirements(wheelhouse, wheels, "kvembed", extras)
            wheel_records = [w.record() for w in wheels]
            wheelhouse_bytes = sum(int(r["bytes"]) for r in wheel_records)
            values = template_values(
                models=names, target_platform=target.platform, machine=target.machine, python=target.python,
                target=target.describe(), prefix=prefix, bundle_name=out.name, kvembed_version=__version__,
                extras=extras, wheel_count=len(wheels), wheelhouse_bytes=wheelhouse_bytes, signed=trust_key is not None)
            written = write_templates(staging, values)
            manifest = {
                "schema": BUNDLE_SCHEMA, "kvembed_version": __version__,
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "target": target.as_json(), "extras": extras, "prefix": prefix,
                "built_with": {"python": platform.python_version(), "pip": pip_version, "machine": platform.machine()},
                "artifacts": records, "wheels": wheel_records, "wheelhouse_bytes": wheelhouse_bytes,
                "trust_key": None if trust_key is None else {"file": TRUST_KEY, "sha256": sha256_file(staging / TRUST_KEY)},
                "files": written,
            }
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
            write_sums(staging)
            if tar:
                say(f"writing {tarball_path(out).name}")
                pending_tar = out.with_name(f".{out.name}.tar.gz.partial-{uuid.uuid4().hex[:8]}")
                with tarfile.open(pending_tar, "w:gz", compresslevel=6) as archive:
                    archive.add(staging, arcname=out.name)
        if pending_tar is not None:
            os.replace(pending_tar, tarball_path(out))
            pending_tar = None
    finally:
        if pending_tar is not None:
            pending_tar.unlink(missing_ok=True)
    return BundleResult(out, tarball_path(out) if tar else None, manifest)


def write_sums(directory: Path) -> Path:
    """``SHA256SUMS`` of every file but the editable ones (``sha256sum -c`` format): install.sh
    checks it, so a wheel or graph damaged on the way to the host is caught before pip runs."""
    lines = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != SUMS and p.name not in EDITABLE):
        lines.append(f"{sha256_file(path)}  {path.relative_to(directory).as_posix()}")
    target = directory / SUMS
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target


def _pip_version() -> str:
    done = run_pip(["--version"])
    found = re.match(r"pip (\S+)", done.stdout)
    if done.returncode != 0 or found is None:
        raise BundleError(f"kvembed bundle needs pip in {sys.executable}'s environment ({done.stdout.strip() or 'pip --version failed'})")
    return found.group(1)
