"""Method options given beside an artifact: the artifact fixes its method and every option, so a
flag that would change them is refused (one line naming what the artifact computes), never ignored."""

from __future__ import annotations

import os
from typing import Any, Mapping

from ..errors import InvalidInput
from ..methods import get_method
from .manifest import Manifest, manifest_of


def check_artifact_options(
    artifact: Manifest | str | os.PathLike[str], method: str | None, options: Mapping[str, Any], max_length: int | None
) -> None:
    """Refuse method options that would contradict what the artifact computes (it fixes them all).
    ``artifact``: its manifest as loaded, or its directory."""
    manifest = manifest_of(artifact)
    directory = str(manifest.artifact_directory())
    held = manifest.method
    holds = f"{held.name} ({', '.join(f'{k}={v}' for k, v in held.options.items()) or 'no options'})"
    if method is not None and get_method(method).name != held.name:
        raise InvalidInput(f"artifact {directory!r} computes {holds}, not {method!r}; drop --method, or export "
                         f"another artifact with kvembed-export --method {method}")
    if options or max_length is not None:
        given = ", ".join("--" + name.replace("_", "-") for name in [*options, *(["max_length"] if max_length is not None else [])])
        raise InvalidInput(f"artifact {directory!r} fixes its method options: it computes {holds} with max_length="
                         f"{manifest.max_length}; drop {given}, or re-export with kvembed-export")
