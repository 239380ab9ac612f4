"""The JSON form of the manifest's typed records: one rule for all of them, so a record read from
disk writes back exactly as it was read, and a record built or changed in code writes its fields.

A record read from JSON keeps that JSON (``raw``): fields a newer exporter added, keys the typed
record does not model and the key order all pass through. A field whose value is what ``raw``
reads as is written as ``raw`` has it; a field changed since (``dataclasses.replace``) or a record
built without ``raw`` writes its typed value.
"""

from __future__ import annotations

import json
from dataclasses import fields, is_dataclass
from typing import Any, Callable, Mapping, Sequence

from ..errors import InvalidInput, shown

#: a JSON key, or the path of keys to a nested one (``("attention", "form")``)
Key = str | tuple[str, ...]


def json_value(value: Any) -> Any:
    """``value`` as JSON: records by their ``to_dict``, mappings and sequences item by item."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {str(key): json_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(item) for item in value]
    return value


def over_raw(
    record: Any, keys: Mapping[str, Key], parse: Callable[[Mapping[str, Any]], Any], skip_none: Sequence[str] = (),
) -> dict[str, Any]:
    """``record``'s JSON form (see the module docstring). ``keys``: field name -> its key in the
    JSON; ``parse`` reads ``raw`` back into a record of the same type (what "unchanged" is compared
    with); ``skip_none``: fields left out of the JSON while they are None."""
    raw: Mapping[str, Any] = getattr(record, "raw", None) or {}
    out: dict[str, Any] = json.loads(json.dumps(raw))
    read = parse(raw) if raw else None
    for name, key in keys.items():
        value = getattr(record, name)
        if read is not None and value == getattr(read, name):
            continue
        if value is None and name in skip_none:
            continue
        path = (key,) if isinstance(key, str) else key
        holder = out
        for part in path[:-1]:
            holder = holder.setdefault(part, {})
        holder[path[-1]] = json_value(value)
    return out


def field_keys(record_type: type, *, renamed: Mapping[str, Key] | None = None, without: Sequence[str] = ("raw",)) -> dict[str, Key]:
    """Field name -> JSON key for a dataclass whose fields are named as their keys, except ``renamed``."""
    assert is_dataclass(record_type)
    renamed = renamed or {}
    return {f.name: renamed.get(f.name, f.name) for f in fields(record_type) if f.name not in without}


def checked_field(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, optional: bool = False) -> Any:
    """``data[key]`` if it is of ``kind`` (or null when ``optional``), else an InvalidInput naming it:
    a hostile or damaged record is one line, not a KeyError or TypeError later."""
    value = data.get(key)
    if value is None and optional:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise InvalidInput(f"{where}: {key} must be {'null or ' if optional else ''}{names}, got {shown(value)}")
    return value
