"""What every kvembed command shares: one-line errors, exit codes, ``--debug``, readable warnings.

(One line, or the few an error class asks for: :attr:`kvembed.errors.KvembedError.lines`.)

Expected failures (bad input, missing files or packages, refused options) print one line on
stderr and exit 2; a check that ran and failed exits 1; Ctrl-C exits 130, and SIGTERM, where a
command takes it like Ctrl-C (:func:`kvembed.signals.sigterm_as_interrupt`), cleans up the same
way and then ends the process by the signal. Anything else is a bug:
one line naming it and how to see the traceback (``--debug`` anywhere on the command line, or
``KVEMBED_DEBUG=1``), exit 1. With debugging on, every error shows its traceback.

Imports only typer, click and rich: it is loaded by every command. Every command shows its waits
(:mod:`kvembed.cli.status`).
"""

from __future__ import annotations

import functools
import os
import re
import sys
import warnings
from typing import Any, Callable, Sequence, TypeVar

import click
import typer
from rich.markup import escape
from typer.core import TyperGroup

from ..errors import MAX_LINES, CheckFailed, KvembedError, shown
from ..extras import missing_extra_message
from ..signals import Terminated, die_by_signal
from ..version import __version__
from .status import Waits, stderr_console

EXIT_FAILED, EXIT_USER, EXIT_INTERRUPTED = 1, 2, 130
DEBUG_FLAG, DEBUG_ENV = "--debug", "KVEMBED_DEBUG"
#: the help epilog of every kvembed program: --debug is taken from argv by :func:`run_app`
DEBUG_HELP = f"Add {DEBUG_FLAG} anywhere on the command line (or set {DEBUG_ENV}=1) to see tracebacks."

#: exceptions whose message is meant for the user: one line, exit 2 (click's usage errors are
#: reported by :func:`run_app`); any other exception is a bug
USER_ERRORS: tuple[type[BaseException], ...] = (KvembedError, OSError)

#: exits and usage errors that typer/click report themselves
_PASS_THROUGH: tuple[type[BaseException], ...] = (
    typer.Exit, typer.Abort, click.exceptions.Exit, click.exceptions.Abort, click.ClickException,
)
errors = stderr_console
F = TypeVar("F", bound=Callable[..., Any])


VERSION_FLAG = "--version"


def version_line() -> str:
    """What ``--version`` prints: ``kvembed 0.1.0`` (:data:`kvembed.version.__version__`)."""
    return f"kvembed {__version__}"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit(0)


def version_option() -> Any:
    """The ``--version`` option of a program's top-level callback (eager: before any other option)."""
    return typer.Option(False, VERSION_FLAG, is_eager=True, expose_value=False, callback=_show_version,
                        help="Print kvembed's version and exit.")


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def one_line(err: BaseException) -> str:
    """The first non-empty line of an exception's message (its type name if it has none)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def user_message(err: BaseException) -> str:
    """What the command line prints of a user error: :func:`one_line`, or for a
    :class:`~kvembed.errors.KvembedError` whose fix takes lines of its own, its first ``lines``
    (:attr:`~kvembed.errors.KvembedError.lines`) lines, the later ones indented as written."""
    if isinstance(err, OSError) and err.strerror and err.filename is not None:
        # the OS's reason and the names as given, each cut (:func:`~kvembed.errors.shown`): a path
        # of thousands of characters (ENAMETOOLONG) is not echoed whole
        names = [shown(os.fsdecode(name)) for name in (err.filename, err.filename2) if name is not None]
        return f"{err.strerror}: {' -> '.join(names)}"
    lines = [line.rstrip() for line in str(err).splitlines() if line.strip()]
    count = min(int(getattr(err, "lines", 1)), MAX_LINES) if isinstance(err, KvembedError) else 1
    if count <= 1 or len(lines) <= 1:
        return one_line(err)
    return "\n".join([lines[0].strip(), *lines[1:count]])


def fail(message: str, code: int = EXIT_USER) -> typer.Exit:
    """Print ``error: message`` on stderr and return the ``typer.Exit`` to raise."""
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def interrupted(err: KeyboardInterrupt, advice: str | None = None) -> typer.Exit:
    """Ctrl-C or SIGTERM (:class:`~kvembed.signals.Terminated`) after the cleanup ran: print
    ``error: interrupted[ (SIGTERM)][: advice]``; SIGTERM then ends the process by the signal, as
    the parent expects; Ctrl-C returns the ``typer.Exit`` (130) to raise."""
    said = "interrupted (SIGTERM)" if isinstance(err, Terminated) else "interrupted"
    stop = fail(f"{said}: {advice}" if advice else said, EXIT_INTERRUPTED)
    if isinstance(err, Terminated):
        die_by_signal(err.signum)
    return stop


def _warning_line(message: Any, category: type[Warning], *_: Any, **__: Any) -> None:
    errors.print(f"[yellow]warning:[/] {escape(' '.join(str(message).split()))}", highlight=False, soft_wrap=True)


def run_guarded(job: Callable[[], Any]) -> Any:
    """Run ``job()`` with kvembed's error policy (see the module docstring); returns its result."""
    if debug_enabled():
        return job()
    with warnings.catch_warnings():
        warnings.showwarning = _warning_line  # one readable line, no source line
        try:
            return job()
        except _PASS_THROUGH:
            raise
        except CheckFailed as err:
            raise fail(one_line(err), EXIT_FAILED) from None
        except ModuleNotFoundError as err:
            message = missing_extra_message(err, _command_path())
            if message is None:
                raise fail(f"unexpected {one_line(err)} (a broken install? rerun with {DEBUG_FLAG} for the traceback)", EXIT_FAILED) from None
            raise fail(message, EXIT_USER) from None
        except USER_ERRORS as err:
            raise fail(user_message(err), EXIT_USER) from None
        except KeyboardInterrupt as err:
            raise interrupted(err) from None
        except Exception as err:  # a bug: say so in one line, and how to see more
            raise fail(
                f"unexpected {type(err).__name__}: {one_line(err)} (a kvembed bug; rerun with {DEBUG_FLAG} "
                f"or {DEBUG_ENV}=1 for the traceback)",
                EXIT_FAILED,
            ) from None


def _command_path() -> str | None:
    """``kvembed serve`` etc. while a command runs (the click context typer vendors), else None."""
    try:
        from typer._click.globals import get_current_context
    except ImportError:  # a typer that uses click itself
        get_current_context = click.get_current_context
    context = get_current_context(silent=True)
    return context.command_path if context is not None else None


def guarded(command: F) -> F:
    """Decorate a typer command with :func:`run_guarded` and the status display of its waits
    (:class:`~kvembed.cli.status.Waits`); typer still sees its signature."""
    if getattr(command, "__kvembed_guarded__", False):
        return command

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with Waits():
            return run_guarded(lambda: command(*args, **kwargs))

    wrapper.__kvembed_guarded__ = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def plain_help(text: Any) -> Any:
    """Help text without the reST markup of docstrings: ``x`` and :func:`x` show as x (anything but
    a str, such as typer's default placeholders, as it is)."""
    if not isinstance(text, str):
        return text
    return _ROLE.sub(r"\1", _LITERAL.sub(r"\1", text))


_LITERAL = re.compile(r"``([^`]+)``")
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def guard_app(app: typer.Typer) -> typer.Typer:
    """Apply :func:`guarded` to every command registered on ``app`` (and its sub-groups), and
    print help as plain text: Rich's help panels cut long option names (``--max-concurrent-re…``)
    and help cells on an 80-column terminal, where click's plain layout wraps them. Help taken
    from docstrings loses their reST markup (:func:`plain_help`)."""
    app.rich_markup_mode = None
    app.info.help = plain_help(app.info.help)
    for info in app.registered_commands:
        if info.callback is not None:
            info.help = plain_help(info.help or info.callback.__doc__)
            info.callback = guarded(info.callback)
    for group in app.registered_groups:
        group.help = plain_help(group.help)
        if group.typer_instance is not None:
            guard_app(group.typer_instance)
    return app


def default_command_group(default: str) -> type[TyperGroup]:
    """A typer group class (``typer.Typer(cls=...)``) whose first argument is the name of one of
    its commands, or else the start of the arguments of its ``default`` command, run under the
    group's own name: ``kvembed export --model ...`` exports, ``kvembed export verify DIR``
    verifies, and ``kvembed export --help`` is the export command's help."""

    class DefaultCommandGroup(TyperGroup):
        def make_context(self, info_name: Any, args: Any, parent: Any = None, **extra: Any) -> Any:
            if args and args[0] in self.commands:
                return super().make_context(info_name, args, parent=parent, **extra)
            return self.commands[default].make_context(info_name, args, parent=parent, **extra)

        def invoke(self, ctx: Any) -> Any:
            if ctx.command is not self:  # the default command's context, made above
                return ctx.command.invoke(ctx)
            return super().invoke(ctx)

    return DefaultCommandGroup


def run_app(app: typer.Typer, argv: Sequence[str] | None = None, prog_name: str | None = None) -> None:
    """Entry point: take ``--debug`` from anywhere in ``argv`` (sets KVEMBED_DEBUG=1), run ``app``,
    and exit with its code. Usage errors (unknown option, missing or malformed value) are one line
    too, instead of click's boxed usage message; a bare command still prints its help."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == [VERSION_FLAG]:  # every program, also the aliases whose first argument is a command's
        print(version_line())
        sys.exit(0)
    if DEBUG_FLAG in args:
        args = [a for a in args if a != DEBUG_FLAG]
        os.environ[DEBUG_ENV] = "1"
    try:
        code = app(args=args, prog_name=prog_name, standalone_mode=False)
    except (typer.Abort, click.exceptions.Abort):
        code = EXIT_INTERRUPTED
    except Exception as err:
        if not _is_usage_error(err):
            raise
        if type(err).__name__ == "NoArgsIsHelpError":  # a bare group or command: its help
            err.show()  # type: ignore[attr-defined]
        else:
            command = getattr(getattr(err, "ctx", None), "command_path", None) or prog_name or "the command"
            fail(f"{err.format_message()} (see {command} --help)")  # type: ignore[attr-defined]
        code = err.exit_code  # type: ignore[attr-defined]
    sys.exit(code if isinstance(code, int) else 0)


def _is_usage_error(err: BaseException) -> bool:
    """A click ``ClickException`` — typer vendors its own click, so matched by its interface."""
    return callable(getattr(err, "format_message", None)) and isinstance(getattr(err, "exit_code", None), int)
