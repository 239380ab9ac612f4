"""Options several kvembed commands share. The method flags are generated from the methods'
option specs (:func:`kvembed.methods.flag_options`): a command decorated with
:func:`method_flags` shows one flag per method option, with the spec's type and flag help."""

from __future__ import annotations

import functools
import inspect
from types import MappingProxyType
from typing import Annotated, Any, Callable, Mapping, Optional, TypeVar

import typer

from ..backends.catalogue import VERIFY_HELP

from ..errors import InvalidInput
from ..methods import flag_options
from ..methods.registry import METHODS
from ..methods.spec import OptionSpec

#: every method's name, as the ``--method`` help lists them (from the method table, never by hand)
METHOD_NAMES = ", ".join(METHODS)

F = TypeVar("F", bound=Callable[..., Any])

#: the parameter a command declares where its method flags go; it receives the options the user set:
#: ``options: opt.MethodOptions = opt.METHOD_FLAGS``
OPTIONS_PARAMETER = "options"
MethodOptions = Mapping[str, Any]
METHOD_FLAGS: MethodOptions = MappingProxyType({})


def _flag_parameter(option: OptionSpec, kind: Any) -> inspect.Parameter:
    """The typer parameter of one method option: ``--name`` (``--name/--no-name`` for a bool)."""
    declaration = f"{option.flag_name}/--no-{option.flag_name[2:]}" if option.type is bool else option.flag_name
    annotation = Annotated[Optional[option.type], typer.Option(declaration, help=option.flag)]  # type: ignore[name-defined]
    return inspect.Parameter(option.name, kind, default=None, annotation=annotation)


def method_flags(command: F) -> F:
    """Put one flag per method option where ``command`` declares its ``options`` parameter; the
    command is called with ``options``: the method options the user set (name -> value)."""
    signature = inspect.signature(command, eval_str=True)
    marker = signature.parameters[OPTIONS_PARAMETER]
    flags = [_flag_parameter(option, marker.kind) for option in flag_options()]
    clash = {p.name for p in flags} & set(signature.parameters)
    if clash:
        raise RuntimeError(f"{command.__name__} declares {', '.join(sorted(clash))}, which are method flags")
    parameters: list[inspect.Parameter] = []
    for parameter in signature.parameters.values():
        parameters.extend(flags if parameter is marker else [parameter])
    names = tuple(p.name for p in flags)

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name, None) for name in names}
        kwargs[OPTIONS_PARAMETER] = {name: value for name, value in given.items() if value is not None}
        return command(*args, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


# ``kvembed verify`` / ``kvembed export verify``: the backend comparison
Backends = Annotated[str, typer.Option("--backends", help=VERIFY_HELP)]
NoCompare = Annotated[bool, typer.Option("--no-compare", help="Skip the backend comparison (parity against PyTorch only).")]
Record = Annotated[bool, typer.Option(
    "--record", help="Record what passed (backend, precision it ran, worst cosine, CPU flags) in the artifact's "
    "kvembed.json 'certified' list, so provider auto can rely on it (a bf16 artifact runs on OpenVINO only once "
    "certified there against PyTorch). The hashed files are not touched.",
)]

OvPrecision = Annotated[Optional[str], typer.Option(
    "--ov-precision", help="--provider openvino: precision hint f32, bf16 or f16 (default: bf16 where the CPU has "
    "BF16; an fp16 artifact keeps its weights at two bytes under f16 on a CPU with FP16, under bf16 on one with BF16).",
)]


def check_ov_precision(provider: str, ov_precision: Optional[str]) -> None:
    """``--ov-precision`` only with ``--provider openvino``, and only one of OpenVINO's hints."""
    if ov_precision is None:
        return
    if provider != "openvino":
        raise InvalidInput("--ov-precision applies to --provider openvino; add it or drop --ov-precision")
    from ..backends.openvino import PRECISIONS

    if ov_precision not in PRECISIONS:
        raise InvalidInput(f"--ov-precision must be one of {', '.join(PRECISIONS)}, got {ov_precision!r}")
