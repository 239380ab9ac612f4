"""Options several kvembed commands share, and the generated ones. The method flags come from the
methods' option specs (:func:`kvembed.methods.flag_options`): a command decorated with
:func:`method_flags` shows one flag per method option, with the spec's type and flag help. The
options of a settings dataclass come from its fields (:func:`dataclass_flags`,
:mod:`kvembed.flagfields`): the default, type and help are the field's, written nowhere else."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from types import MappingProxyType
from typing import Annotated, Any, Callable, Mapping, Optional, TypeVar, get_args, get_type_hints

import typer

from ..export.gate.targets import TARGETS_HELP

from ..errors import InvalidInput, shown, with_hint
from ..flagfields import Flag, flags_of
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
#: the marker of :func:`dataclass_flags`' parameter: ``settings: opt.Given = opt.GIVEN``
Given = Mapping[str, Any]
GIVEN: Given = MappingProxyType({})


def method_flags(command: F) -> F:
    """Put one flag per method option where ``command`` declares its ``options`` parameter; the
    command is called with ``options``: the method options the user set (name -> value)."""

    def given(values: dict[str, Any], context: typer.Context) -> dict[str, Any]:
        return {name: value for name, value in values.items() if value is not None}

    return _splice(command, OPTIONS_PARAMETER, [_flag_parameter(option) for option in flag_options()], given)


def dataclass_flags(cls: type, parameter: str, skip: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Put one option per :func:`kvembed.flagfields.flag` field of the dataclass ``cls`` (but
    ``skip``) where the command declares ``parameter``, with the field's default, type and help;
    the command is called with ``parameter``: the fields given on the command line (name -> value,
    text parsed, repeated options as tuples), so everything else keeps the dataclass's default."""
    fields = {name: spec for name, spec in flags_of(cls).items() if name not in skip}
    types = get_type_hints(cls)
    options = [_field_parameter(name, field, flag, types[name]) for name, (field, flag) in fields.items()]

    def given(values: dict[str, Any], context: typer.Context) -> dict[str, Any]:
        chosen: dict[str, Any] = {}
        for name, value in values.items():
            source = context.get_parameter_source(name)  # compared by name: recent typers vendor their own click
            if source is None or source.name == "DEFAULT":
                continue
            flag = fields[name][1]
            if flag.many:
                value = tuple(value or ())
            chosen[name] = flag.parse(value) if flag.parse is not None and value is not None else value
        return chosen

    return lambda command: _splice(command, parameter, options, given)


def _flag_parameter(option: OptionSpec) -> inspect.Parameter:
    """The typer parameter of one method option: ``--name`` (``--name/--no-name`` for a bool)."""
    declaration = f"{option.flag_name}/--no-{option.flag_name[2:]}" if option.type is bool else option.flag_name
    annotation = Annotated[Optional[option.type], typer.Option(declaration, help=option.flag)]  # type: ignore[name-defined]
    return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)


def _field_parameter(name: str, field: dataclasses.Field, flag: Flag, kind: Any) -> inspect.Parameter:
    """The typer parameter of one dataclass field: its type (text where the field parses it,
    a list where it repeats), default and help."""
    if flag.parse is not None:
        kind, default = (str if flag.text is not None else Optional[str]), flag.text
    elif flag.many:
        kind, default = Optional[list[_item_type(kind)]], None  # type: ignore[misc]
    else:
        default = field.default
    option = typer.Option(*flag.spelled(name), help=flag.help, envvar=flag.envvar)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, option])


def _item_type(kind: Any) -> Any:
    """``tuple[T, ...]`` (or ``T``) -> ``T``."""
    arguments = get_args(kind)
    return arguments[0] if arguments else kind


#: the parameter through which typer hands a generated command its context (which says which
#: options were given); the command itself never sees it
CONTEXT_PARAMETER = "kvembed_cli_context"


def _splice(command: F, marker_name: str, added: list[inspect.Parameter],
            collect: Callable[[dict[str, Any], typer.Context], dict[str, Any]]) -> F:
    """``command`` with the parameters ``added`` in place of its parameter ``marker_name``, which
    receives ``collect`` of their values and typer's context."""
    signature = inspect.signature(command, eval_str=True)
    marker = signature.parameters[marker_name]
    added = [p.replace(kind=marker.kind) for p in added]
    clash = {p.name for p in added} & set(signature.parameters)
    if clash:
        raise RuntimeError(f"{command.__name__} declares {', '.join(sorted(clash))}, which are generated options")
    context = inspect.Parameter(CONTEXT_PARAMETER, marker.kind, default=None, annotation=typer.Context)
    parameters: list[inspect.Parameter] = []
    for parameter in signature.parameters.values():
        parameters.extend([*added, context] if parameter is marker else [parameter])
    names = tuple(p.name for p in added)

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs[marker_name] = collect({name: kwargs.pop(name, None) for name in names}, kwargs.pop(CONTEXT_PARAMETER))
        return command(*args, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


# ``kvembed verify`` / ``kvembed export verify``: the backend comparison
Backends = Annotated[str, typer.Option("--backends", help=TARGETS_HELP)]
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
    from ..backends.targets import OPENVINO_HINTS as PRECISIONS

    if ov_precision not in PRECISIONS:
        raise InvalidInput(with_hint(f"--ov-precision must be one of {', '.join(PRECISIONS)}, got {shown(ov_precision)}",
                                     ov_precision, PRECISIONS))
