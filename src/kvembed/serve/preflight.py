"""What ``kvembed serve`` checks before it binds the port: each artifact's manifest, its files
against their sha256, its tokenizer, the per-input cap against its prompt, and the provider.

These are the cheap failures: hashing is a fraction of opening the onnxruntime session
(benchmarks/log/serve.md), which stays in the app's loading thread after the bind so that
``/health`` answers 503 while it runs. A damaged artifact is then one error line and exit 2, and
no server ever starts; the loading thread opens the checked files without hashing them again,
with the manifest and the encoder built here (:class:`Checked`), so nothing is read or built twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from ..artifact import DamagedArtifact, Manifest, UntrustedArtifact, check_intact, load_manifest, verify_signature
from ..artifact.engine import is_engine_dir, read_engine_json
from ..runtime.artifact import encoder_from_manifest
from ..runtime.encoding import TextEncoder
from .config import ServeConfig
from .model import input_cap
from ..backends.catalogue import provider_problem
from ..errors import InvalidInput, MissingDependency


class Checked(NamedTuple):
    """One artifact as the preflight read and checked it: what ``Embedder.load`` takes, not again."""

    manifest: Manifest
    encoder: TextEncoder


def check_artifacts(config: ServeConfig) -> dict[str, Checked]:
    """Raise ValueError (FileNotFoundError, MissingDependency) naming the first model that cannot be
    served; model name -> its manifest and encoder, as read once and checked."""
    if not all(is_engine_dir(directory) for _, directory in config.artifacts):
        problem = provider_problem(config.provider)  # a GPU provider this onnxruntime lacks: named here, not after the bind
        if problem is not None:
            raise MissingDependency(f"--provider {config.provider}: {problem}")
    return {name: check_artifact(name, directory, config) for name, directory in config.artifacts}


def check_artifact(name: str, directory: Path, config: ServeConfig) -> Checked:
    """One artifact (or TensorRT engine directory): intact, tokenizer readable, room for text under
    the cap; its manifest and encoder, as read once and checked. Under a trust key its signature first."""
    if config.trust_key is not None:
        try:
            verify_signature(directory, config.trust_key)
        except UntrustedArtifact as err:
            raise UntrustedArtifact(f"model {name!r}: {err}") from None
    manifest = load_manifest(directory)
    engine = None
    if is_engine_dir(directory):
        if config.provider not in ("auto", "tensorrt"):
            raise InvalidInput(f"model {name!r}: {str(directory)!r} is a TensorRT engine directory: serve it with --provider tensorrt (or auto)")
        engine = read_engine_json(directory)
    try:
        check_intact(manifest, engine)
    except DamagedArtifact as err:
        raise DamagedArtifact(f"model {name!r}: {err}") from None
    try:
        encoder = encoder_from_manifest(directory, manifest)
    except Exception as err:  # tokenizers raises its own Exception type for an unreadable file
        raise InvalidInput(f"model {name!r}: cannot read the tokenizer of {str(directory)!r}: {err}") from None
    cap = input_cap(config, encoder.max_length)
    prompt = max(len(encoder.encode_one("", kind).ids) for kind in encoder.method.templates)
    if prompt >= cap:
        raise InvalidInput(
            f"--max-input-tokens {config.max_input_tokens} leaves no room for text in model {name!r}: its "
            f"{encoder.method.name} prompt alone takes {prompt} tokens; give more"
        )
    return Checked(manifest, encoder)
