"""Signed artifacts: the manifest's sha256 list catches accidents, a signature catches tampering.

``kvembed sign`` (:func:`sign_artifact`) signs the whole artifact folder with OpenSSF
`model-signing <https://github.com/sigstore/model-transparency>`_ and an elliptic-curve private
key (no network, no Sigstore identity): every file in it, the manifest included, is hashed
(sha256) into the signed statement, which is written to :data:`~.layout.SIGNATURE`
(``kvembed.sig``) inside the folder; that one file is left out of what it signs. A loader given a
*trust key* (the PEM public key of the signing key: ``Embedder.load(trust_key=...)``, every
command's ``--trust-key`` or ``KVEMBED_TRUST_KEY``) calls :func:`verify_signature` before it reads
anything else, and refuses, in one line naming the artifact and what failed, an artifact that is
not signed, is signed by another key, or whose files differ from what was signed (also when the
manifest's hashes were rewritten to match). Without a trust key nothing is checked beyond the
manifest's hashes.

model-signing (``pip install 'kvembed[sign]'``) is imported inside these functions only, and only
when a key is given: importing this module, or the runtime, never imports it.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import sys
import uuid
from pathlib import Path
from typing import Any

from ..errors import InvalidInput, MissingDependency
from ..extras import install_hint
from .engine import is_engine_dir, read_engine_json
from .layout import MANIFEST, SIGNATURE, is_artifact

__all__ = ["TRUST_KEY_ENV", "UntrustedArtifact", "sign_artifact", "trust_key_path", "verify_signature"]

#: the environment variable every command reads its ``--trust-key`` from when the option is not given
TRUST_KEY_ENV = "KVEMBED_TRUST_KEY"
#: the curves model-signing's key signer takes (Sigstore's)
CURVES = {"secp256r1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521"}
#: how a key is made, for messages
MAKE_KEY = "openssl ecparam -name prime256v1 -genkey -noout -out key.pem"


class UntrustedArtifact(InvalidInput):
    """A trust key was given and the artifact's signature does not prove it: unsigned, signed by
    another key, or its files differ from what was signed. The message names the artifact and what
    failed."""


def trust_key_path(value: str | os.PathLike[str] | None) -> Path | None:
    """A trust key as given (an option, ``KVEMBED_TRUST_KEY``): None for none or an empty value
    (an empty variable means no key), else the path, ``~`` expanded."""
    if value is None or str(value).strip() == "":
        return None
    return Path(value).expanduser()


def _model_signing(purpose: str) -> Any:
    """The ``model_signing`` package, or :class:`MissingDependency` naming the extra."""
    try:
        import model_signing
        import model_signing.hashing
        import model_signing.signing
        import model_signing.verifying
    except ImportError as err:
        raise MissingDependency(f"{purpose} needs model-signing, which the 'sign' extra brings: {install_hint('sign')} "
                                f"(no module named {getattr(err, 'name', None) or err!s})") from None
    return model_signing


def _hashing(model_signing: Any) -> Any:
    """What is signed: every file of the folder and its subfolders (git files included: nothing
    is skipped by name) but the signature itself, by sha256; a symbolic link is refused."""
    return (model_signing.hashing.Config()
            .use_file_serialization(hashing_algorithm="sha256", allow_symlinks=False)
            .set_ignored_paths(paths=[SIGNATURE], ignore_git_paths=False))


def _read_key(path: Path, private: bool, what: str) -> Any:
    """The elliptic-curve key in the PEM file ``path`` (cryptography comes with model-signing);
    InvalidInput saying what is wrong with the file."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    kind = "private" if private else "public"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InvalidInput(f"{what} {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise InvalidInput(f"{what} {str(path)!r} is a directory, not a PEM {kind} key file") from None
    except OSError as err:
        raise InvalidInput(f"{what} {str(path)!r} cannot be read ({err.strerror or err})") from None
    try:
        key = serialization.load_pem_private_key(data, None) if private else serialization.load_pem_public_key(data)
    except TypeError:  # an encrypted private key, and no password
        raise InvalidInput(f"{what} {str(path)!r} is encrypted; give it unencrypted (openssl ec -in KEY -out PLAIN)") from None
    except Exception:  # cryptography: ValueError, or its own errors for malformed ASN.1
        hint = f" (make a key pair: {MAKE_KEY}; its public key: openssl ec -in key.pem -pubout -out pub.pem)"
        swapped = b"PRIVATE KEY" in data if not private else b"PUBLIC KEY" in data
        if swapped:
            other = "private" if not private else "public"
            raise InvalidInput(f"{what} {str(path)!r} holds a {other} key, not a {kind} one{hint}") from None
        raise InvalidInput(f"{what} {str(path)!r} is not a PEM {kind} key{hint}") from None
    public = key.public_key() if private else key
    if not isinstance(public, ec.EllipticCurvePublicKey) or public.curve.name not in CURVES:
        curve = getattr(getattr(public, "curve", None), "name", None)
        found = f"an elliptic-curve key on {curve}" if curve else f"an {type(public).__name__.strip('_').removesuffix('PublicKey')} key"
        raise InvalidInput(f"{what} {str(path)!r} holds {found}; model-signing takes an elliptic-curve key on "
                           f"{', '.join(CURVES.values())}, e.g. from {MAKE_KEY}")
    return key


def _check_folder(directory: Path) -> Any:
    """The artifact's manifest, once every file it lists matches its hash: a damaged artifact is
    never signed. An engine directory's plan is checked against its ``engine.json``."""
    from .files import check_intact
    from .manifest import load_manifest

    if not is_artifact(directory):
        raise InvalidInput(f"no kvembed artifact at {str(directory)!r} (no {MANIFEST})")
    engine = read_engine_json(directory) if is_engine_dir(directory) else None
    return check_intact(load_manifest(directory), engine)


def sign_artifact(directory: str | os.PathLike[str], private_key: str | os.PathLike[str]) -> Path:
    """Sign the artifact (or engine directory) ``directory`` with the elliptic-curve PEM private
    key ``private_key``: every file in the folder, the manifest included, is hashed into the
    signature, written to ``kvembed.sig`` in the folder (replacing an earlier one). Returns its path.

    The artifact must be intact first (:func:`~.files.check_intact`). Anything that changes a file
    afterwards (``kvembed verify --record`` rewrites the manifest) leaves a signature that no longer
    verifies: sign again."""
    directory = Path(directory).expanduser()
    key = Path(private_key).expanduser()
    model_signing = _model_signing("kvembed sign")
    _read_key(key, private=True, what="private key")
    _check_folder(directory)
    target = directory / SIGNATURE
    partial = directory / f".{SIGNATURE}.partial-{uuid.uuid4().hex[:8]}"  # written after the files are hashed
    try:
        config = model_signing.signing.Config().use_elliptic_key_signer(private_key=key)
        config.set_hashing_config(_hashing(model_signing)).sign(directory.resolve(), partial)  # the folder a link names
        os.replace(partial, target)
    except (InvalidInput, OSError):
        raise
    except Exception as err:  # model-signing's ValueError (a symbolic link, a special file)
        raise InvalidInput(f"cannot sign {str(directory)!r}: {_link(_first_line(err)) or _first_line(err)}") from None
    finally:
        partial.unlink(missing_ok=True)
    return target


def verify_signature(directory: str | os.PathLike[str], trust_key: str | os.PathLike[str]) -> Path:
    """Check that the artifact (or engine directory) ``directory`` is signed by the private key of
    the PEM public key ``trust_key`` and that every file in it is what was signed; returns the
    signature's path. :class:`UntrustedArtifact` otherwise, one line naming the artifact and what
    failed: not signed, signed by another key, a file changed, added or missing since signing.
    Hashes every file: a fraction of what opening the graph costs."""
    directory = Path(directory).expanduser()
    key = Path(trust_key).expanduser()
    model_signing = _model_signing(f"checking the signature of {str(directory)!r} (a trust key was given)")
    _read_key(key, private=False, what="trust key")
    refused = f"artifact {str(directory)!r} is not trusted by {key.name}:"
    if not directory.is_dir():
        raise InvalidInput(f"no kvembed artifact at {str(directory)!r}")
    signature = directory / SIGNATURE
    if not signature.is_file() or signature.is_symlink():
        what = "is not a regular file" if signature.exists() or signature.is_symlink() else "is missing"
        raise UntrustedArtifact(f"{refused} it is not signed ({SIGNATURE} {what}; the signer writes it with "
                                f"kvembed sign {directory} --private-key KEY.pem)")
    config = model_signing.verifying.Config().use_elliptic_key_verifier(public_key=key)
    config.set_hashing_config(_hashing(model_signing))
    try:
        with contextlib.redirect_stdout(sys.stderr):  # model-signing prints its warnings
            config.verify(directory.resolve(), signature)  # the folder a link names: links inside are refused
    except Exception as err:
        raise UntrustedArtifact(f"{refused} {_why(err)}") from None
    return signature


def _why(err: Exception) -> str:
    """model-signing's refusal in kvembed's words (its own first line where it is not one of these)."""
    from cryptography.exceptions import InvalidSignature

    text = _first_line(err)
    if isinstance(err, InvalidSignature):
        return f"{SIGNATURE} does not verify with this key (the signature was altered, or made by another key)"
    if text.startswith("Key mismatch"):
        return f"{SIGNATURE} was signed by another key"
    if text.startswith("Signature mismatch"):
        return f"its files differ from what was signed: {_differences(text)}"
    if _link(text):
        return _link(text)
    if isinstance(err, (KeyError, TypeError, ValueError)) and not text.startswith("Cannot use"):
        return f"{SIGNATURE} is not a model-signing signature of this folder ({text})"
    return text


def _link(text: str) -> str | None:
    """model-signing's refusal of a symbolic link, in kvembed's words; None for another message."""
    link = re.match(r"Cannot use '(.*)' because it is a symlink", text)
    return f"{Path(link.group(1)).name} is a symbolic link (a signed folder holds regular files only)" if link else None


def _differences(text: str) -> str:
    """model-signing's list of differences (``Signature mismatch: [...]``) as one short clause."""
    try:
        items = ast.literal_eval(text.split(":", 1)[1].strip())
    except (ValueError, SyntaxError, IndexError):
        return text
    said = []
    for item in items if isinstance(items, list) else [str(items)]:
        changed = re.match(r"Hash mismatch for '(.*?)':", item)
        extra = re.match(r"Extra files found in model '.*?': (.*)$", item)
        missing = re.match(r"Missing files in model '.*?': (.*)$", item)
        if changed:
            said.append(f"{changed.group(1)} changed")
        elif extra:
            said.append(f"not signed: {extra.group(1)}")
        elif missing:
            said.append(f"missing: {missing.group(1)}")
        else:
            said.append(str(item))
    return "; ".join(said) or text


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__
