"""The method options that are command-line flags: one flag per option name, across every method.

Every command that takes method options builds its flags from :func:`flag_options`, so a new
:class:`~kvembed.methods.spec.OptionSpec` with a ``flag`` help shows up in all of them.
"""

from __future__ import annotations

from .registry import METHODS
from .spec import MethodSpec, OptionSpec


def flag_options(methods: "dict[str, MethodSpec] | None" = None) -> tuple[OptionSpec, ...]:
    """The options with a flag, each name once, in the order the methods declare them.

    Methods that share an option name share its flag: a second declaration with another type or
    flag help is a mistake in the method definitions (a RuntimeError, not a user error)."""
    found: dict[str, OptionSpec] = {}
    for spec in (METHODS if methods is None else methods).values():
        for option in spec.options:
            if option.flag is None:
                continue
            first = found.setdefault(option.name, option)
            if (first.type, first.flag) != (option.type, option.flag):
                raise RuntimeError(
                    f"method {spec.name!r} declares option {option.name} as {option.type.__name__} "
                    f"({option.flag!r}); another method declares it as {first.type.__name__} ({first.flag!r})"
                )
    return tuple(found.values())
