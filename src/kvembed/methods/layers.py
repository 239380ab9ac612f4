"""The layer-set syntax shared by every method option named ``layers``.

Accepted forms: ``"12-21"``, ``"10,11,20,26-31"``, ``"none"`` (the empty set), ``"auto"``
(intrinsic-dimension selection, resolved elsewhere), or a sequence of ints.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from ..errors import InvalidInput

AUTO = "auto"
NONE = "none"


def parse_layers(spec: str | int | Iterable[int] | None, num_layers: int) -> tuple[int, ...] | str:
    """Parse a layer-set spec into sorted unique 0-based indices, or the string ``"auto"``.

    Raises :class:`~kvembed.errors.InvalidInput` (a ``ValueError``) naming the valid range for an
    index outside ``0..num_layers-1`` and showing the syntax for anything unparsable.
    """
    if spec is None:
        return ()
    if isinstance(spec, bool):
        raise InvalidInput(_syntax_error(spec))
    if isinstance(spec, int):
        indices: list[int] = [spec]
    elif isinstance(spec, str):
        text = spec.strip().lower()
        if text == AUTO:
            return AUTO
        if text in (NONE, ""):
            return ()
        indices = []
        for part in text.split(","):
            part = part.strip()
            if not part:
                raise InvalidInput(_syntax_error(spec))
            lo, sep, hi = part.partition("-")
            try:
                if sep:
                    start, stop = int(lo), int(hi)
                    if stop < start:
                        raise InvalidInput(f"layer range {part!r} runs backwards; write it as {stop}-{start}")
                    indices.extend(range(start, stop + 1))
                else:
                    indices.append(int(part))
            except InvalidInput:
                raise
            except ValueError:  # int() of something that is not a number
                raise InvalidInput(_syntax_error(spec)) from None
    else:
        try:
            indices = [int(i) for i in spec]
        except (TypeError, ValueError):
            raise InvalidInput(_syntax_error(spec)) from None
    bad = sorted({i for i in indices if not 0 <= i < num_layers})
    if bad:
        raise InvalidInput(
            f"layer index {', '.join(map(str, bad))} is out of range: this model has {num_layers} "
            f"decoder layers, valid indices are 0..{num_layers - 1}"
        )
    return tuple(sorted(set(indices)))


def format_layers(layers: Sequence[int]) -> str:
    """Inverse of :func:`parse_layers` for display: ``(10, 11, 12, 20)`` -> ``"10-12,20"``."""
    if not layers:
        return NONE
    parts: list[str] = []
    start = prev = layers[0]
    for i in list(layers[1:]) + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


def _syntax_error(spec: object) -> str:
    return (
        f"cannot read layer set {spec!r}: use a range like '12-21', a list like '10,11,20,26-31', "
        f"'none' (no layers) or 'auto'"
    )
