"""``kvembed bundle``: the command. Imports only typer/rich at the top (``kvembed --help`` stays fast)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

errors = Console(stderr=True)
console = Console()


def bundle_command(
    artifacts: list[str] = typer.Argument(..., help="Artifact directories (DIR, named after its folder, or NAME=DIR)."),
    out: Path = typer.Option(..., "--out", "-o", help="Bundle directory to write (written beside, renamed when complete)."),
    platform: Optional[str] = typer.Option(None, "--platform", help="Target: linux-x86_64 or linux-aarch64 (default: this machine's)."),
    python: Optional[str] = typer.Option(None, "--python", help="Target CPython version, e.g. 3.11 or 3.12 (default: this interpreter's)."),
    glibc: Optional[str] = typer.Option(None, "--glibc", help="Oldest glibc on the target (manylinux; default 2.28)."),
    with_: Optional[list[str]] = typer.Option(None, "--with", help="Add an extra's wheels: openvino or triton (repeatable)."),
    tar: bool = typer.Option(False, "--tar", help="Also write OUT.tar.gz beside the directory."),
    prefix: str = typer.Option("/opt/kvembed", "--prefix", help="Where the bundle will live on the host (the systemd unit's paths)."),
    kvembed_wheel: Optional[Path] = typer.Option(None, "--kvembed-wheel", help="Use this kvembed wheel instead of building one from the checkout."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --out (and its .tar.gz)."),
    trust_key: Optional[Path] = typer.Option(None, "--trust-key", help="PEM public key every artifact must be signed with "
                                             "(kvembed sign): checked now, carried as trust.pem, and checked again by "
                                             "install.sh with the installed kvembed (adds the sign extra's wheels)."),
) -> None:
    """Write an air-gapped bundle: artifacts, a wheelhouse resolved by pip for the target, install.sh,
    run.sh, a systemd unit, a Dockerfile, README.md and bundle.json. Needs the package index while it
    runs; the bundle then installs and serves with no network."""
    from ..bundle.build import build_bundle
    from ..bundle.target import parse_target
    from ..signals import sigterm_as_interrupt

    target = parse_target(platform, python, glibc)
    started = time.monotonic()
    with sigterm_as_interrupt():  # a scheduler's stop cleans up the staging directory, as Ctrl-C does
        result = build_bundle(
            artifacts, out, target, with_=list(with_ or []), tar=tar, force=force, prefix=prefix,
            kvembed_wheel=kvembed_wheel, trust_key=trust_key, progress=lambda message: errors.print(f"kvembed bundle: {message}", highlight=False, soft_wrap=True),
        )
    wheels = result.manifest["wheels"]
    console.print(
        f"wrote {result.path} for {target.describe()}: {len(result.manifest['artifacts'])} artifact(s), "
        f"{len(wheels)} wheels ({result.manifest['wheelhouse_bytes'] / 1e6:.1f} MB)"
        + (f", and {result.tarball}" if result.tarball else "") + f" in {time.monotonic() - started:.0f} s",
        highlight=False, soft_wrap=True,
    )
    console.print(f"on the host: {result.path.name}/install.sh, then {result.path.name}/run.sh (see {result.path.name}/README.md)",
                  highlight=False, soft_wrap=True)
