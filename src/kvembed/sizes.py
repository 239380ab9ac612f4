"""Byte sizes as people write them on a command line (``2MB``, ``512KiB``, ``4GiB``, ``1048576``).

Shared by ``kvembed serve --payload-limit`` and ``kvembed build-engine --workspace``. No imports
beyond the standard library.
"""

from __future__ import annotations

import re

from .errors import InvalidInput

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", re.IGNORECASE)
_POWERS = {"B": 0, "K": 1, "M": 2, "G": 3, "T": 4}


def parse_size(value: str | int) -> int:
    """Bytes from ``"4GiB"`` (binary units), ``"1.5GB"`` (decimal), ``"1048576"`` or an int;
    ValueError naming the value and the accepted forms when it is none of them or not positive."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        match = _SIZE.fullmatch(str(value))
        if not match:
            raise InvalidInput(f"cannot read size {value!r}: use a number of bytes or a number with a unit "
                             "(B, KB, MB, GB, KiB, MiB, GiB), e.g. 2MB or 4GiB")
        unit = (match.group(2) or "B").upper()
        base = 1024 if "I" in unit else 1000
        size = int(float(match.group(1)) * base ** _POWERS[unit[0]])
    if size < 1:
        raise InvalidInput(f"size {value!r} must be positive")
    return size
