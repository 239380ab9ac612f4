"""``kvembed sign`` and the ``--trust-key`` option every loading command shares. Imports only
typer/rich at the top (``kvembed --help`` stays fast); model-signing loads inside the command, and
for ``--trust-key`` only when a key is given."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from ..artifact.signing import TRUST_KEY_ENV, trust_key_path

console = Console()

#: ``--trust-key PUB.pem`` (or ``KVEMBED_TRUST_KEY``): load only artifacts signed by its private key
TrustKey = Annotated[Optional[str], typer.Option(
    "--trust-key", envvar=TRUST_KEY_ENV, show_default=False,
    help="PEM public key: load only artifacts that kvembed sign signed with its private key, every file as signed "
    "(refused: unsigned, another key, a file changed since signing). Needs the sign extra.",
)]


def trusted(key: Optional[str]) -> Optional[Path]:
    """The trust key a command was given (``--trust-key`` or ``KVEMBED_TRUST_KEY``; empty: none)."""
    return trust_key_path(key)


def check_trusted(directory: Any, key: Optional[str]) -> None:
    """Refuse ``directory`` (one line, exit 2) unless its signature verifies with the trust key;
    nothing happens, and model-signing is not imported, when no key is given."""
    path = trusted(key)
    if path is not None:
        from ..artifact.signing import verify_signature

        verify_signature(directory, path)


def sign_command(
    artifact: Path = typer.Argument(..., help="Artifact directory (or TensorRT engine directory) to sign."),
    private_key: Path = typer.Option(..., "--private-key", help="PEM elliptic-curve private key (P-256, P-384 or P-521), "
                                     "e.g. from: openssl ecparam -name prime256v1 -genkey -noout -out key.pem"),
) -> None:
    """Sign an artifact folder (every file, the manifest included) with OpenSSF model-signing and a
    private key: writes kvembed.sig inside it. Loaders given the public key (--trust-key PUB.pem
    or KVEMBED_TRUST_KEY) then refuse the artifact if any file changed since.

    kvembed sign ARTIFACT --private-key key.pem | then: kvembed embed ARTIFACT "text" --trust-key pub.pem
    """
    from ..artifact.signing import sign_artifact
    from ..status import waiting

    with waiting(f"hashing and signing the files of {artifact}"):
        signature = sign_artifact(artifact, private_key)
    console.print(f"signed {artifact} with {private_key.name}: wrote {signature} (every file of the folder; "
                  f"check it with --trust-key and the public key)", highlight=False, soft_wrap=True)
