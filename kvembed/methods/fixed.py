"""An exported artifact fixes its method and every option: refuse choices that contradict it.

``kvembed embed ARTIFACT`` and ``kvembed eval ARTIFACT`` take the method flags for models; given
with an artifact they would be silently ignored, so they are refused, naming the way out.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import InvalidInput
from .registry import get_method


def check_artifact_options(
    directory: str,
    held: Mapping[str, Any],
    held_max_length: int,
    method: str | None,
    options: Mapping[str, Any],
    max_length: int | None,
) -> None:
    """Refuse a ``method``, method ``options`` or ``max_length`` given for the artifact in
    ``directory``, whose manifest records the method ``held`` (name, options) and ``held_max_length``."""
    holds = f"{held['name']} ({', '.join(f'{k}={v}' for k, v in held.get('options', {}).items()) or 'no options'})"
    if method is not None and get_method(method).name != held["name"]:
        raise InvalidInput(f"artifact {directory!r} computes {holds}, not {method!r}; drop --method, or export "
                           f"another artifact with kvembed-export --method {method}")
    if options or max_length is not None:
        given = ", ".join("--" + name.replace("_", "-") for name in [*options, *(["max_length"] if max_length is not None else [])])
        raise InvalidInput(f"artifact {directory!r} fixes its method options: it computes {holds} with max_length="
                           f"{held_max_length}; drop {given}, or re-export with kvembed-export")
