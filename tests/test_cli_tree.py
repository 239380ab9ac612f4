"""The one command tree: ``kvembed export`` / ``kvembed layers`` beside their aliases
``kvembed-export`` / ``kvembed-layers``, method flags generated from the option specs, and the
error policy that tells bad input (one line, exit 2) from a bug (exit 1, traceback with --debug).

Torch-free and fast: nothing here exports or loads a model.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

import pytest
import typer
from typer.testing import CliRunner

from kvembed.cli import export as export_cli
from kvembed.cli import layers as layers_cli
from kvembed.cli.main import app
from kvembed.cli.options import GIVEN, Given, dataclass_flags, method_flags
from kvembed.corpus.options import CorpusOptions
from kvembed.errors import InvalidInput, KvembedError
from kvembed.flagfields import flag, flag_name, flags_of
from kvembed.methods import METHODS, MethodSpec, OptionSpec, flag_options
from kvembed.serve.config import ServeConfig
from kvembed.sizes import parse_size
from kvembed.triton.options import ServingOptions

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def help_of(target: typer.Typer, *args: str) -> str:
    result = runner.invoke(target, [*args, "--help"], env={"COLUMNS": "100"}, prog_name="kvembed")
    assert result.exit_code == 0, result.output
    return result.output


def body(text: str) -> str:
    """A help text without its usage line (which names the program)."""
    return text.split("\n", 1)[1]


# -- one tree, aliases kept ------------------------------------------------------------------------


def test_export_and_layers_are_subcommands_of_kvembed():
    listing = help_of(app)
    assert "\n  export " in listing and "\n  layers " in listing
    assert help_of(app, "export").startswith("Usage: kvembed export [OPTIONS]")
    assert help_of(app, "export", "verify").startswith("Usage: kvembed export verify [OPTIONS]")
    assert help_of(app, "layers").startswith("Usage: kvembed layers [OPTIONS]")


def test_the_aliases_show_the_same_options_as_the_subcommands():
    assert body(help_of(export_cli.app)) == body(help_of(app, "export"))
    assert body(help_of(export_cli.app, "verify")) == body(help_of(app, "export", "verify"))
    assert body(help_of(app, "export", "verify")).startswith(body(help_of(app, "verify")))  # + the --debug epilog
    alias = body(help_of(layers_cli.app))
    for option in ("--model", "--out", "--calibration", "--num-texts", "--prompt", "--batch-size", "--max-length", "--quiet"):
        assert option in alias and option in help_of(app, "layers")


def test_kvembed_export_refuses_like_kvembed_export_alias():
    """A missing required option is the same usage error under both names."""
    for target, args in ((app, ["export", "--model", "stories260k"]), (export_cli.app, ["--model", "stories260k"])):
        result = runner.invoke(target, args)
        assert result.exit_code == 2 and "Missing option '--out'" in result.output  # --method defaults


def _console_script(name: str) -> str | None:
    """The console script on PATH, if it runs this checkout's code (an install of another tree, or
    one made before the CLI moved, does not count)."""
    import shutil

    found = shutil.which(name)
    if found is None:
        return None
    probe = subprocess.run([found, "--help"], capture_output=True, text=True, timeout=120)
    return found if probe.returncode == 0 else None


@pytest.mark.parametrize("program, args, usage", [
    ("kvembed", ["export"], "Usage: kvembed export [OPTIONS]"),
    ("kvembed", ["layers"], "Usage: kvembed layers [OPTIONS]"),
    ("kvembed-export", [], "Usage: kvembed-export [OPTIONS]"),
    ("kvembed-export", ["verify"], "Usage: kvembed-export verify [OPTIONS]"),
    ("kvembed-layers", [], "Usage: kvembed-layers [OPTIONS]"),
])
def test_console_scripts(program, args, usage):
    path = _console_script(program)
    if path is None:
        pytest.skip(f"{program} is not installed from this checkout")
    done = subprocess.run([path, *args, "--help"], capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "100"})
    assert done.returncode == 0 and done.stdout.startswith(usage), done.stdout + done.stderr


# -- method flags come from the option specs -------------------------------------------------------


def _click_params(target: typer.Typer, *path: str) -> dict[str, object]:
    command = typer.main.get_command(target)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return {param.name: param for param in command.params}


@pytest.mark.parametrize("path", [("embed",), ("eval",), ("bench",), ("export", "export")])
def test_every_command_with_method_options_has_every_flag(path):
    params = _click_params(app, *path)
    for option in flag_options():
        assert option.name in params, (path, option.name)
        assert option.flag_name in params[option.name].opts  # type: ignore[attr-defined]


def test_a_new_option_spec_shows_up_as_a_flag(monkeypatch):
    spec = MethodSpec(
        name="test-method", summary="", prompts={"raw": {"query": "{text}", "document": "{text}"}}, default_prompt="raw",
        readout="hidden", pooling="mean",
        options=(OptionSpec("window", int, 4, "tokens per window", flag="test-method: tokens per window."),
                 OptionSpec("strict", bool, False, "refuse long texts", flag="test-method: refuse long texts."),
                 OptionSpec("hidden_detail", str, "", "set by a checkpoint")),
    )
    monkeypatch.setitem(METHODS, spec.name, spec)
    seen: list[dict] = []

    @method_flags
    def command(name: str = typer.Option("x", "--name"), options: dict = {}, last: int = typer.Option(1, "--last")) -> None:
        seen.append(dict(options))

    demo = typer.Typer(rich_markup_mode=None)
    demo.command()(command)
    text = help_of(demo)
    assert "--window <int>" in text and "test-method: tokens per window." in text
    assert "--strict / --no-strict" in text and "--hidden-detail" not in text
    assert text.index("--name") < text.index("--layers") < text.index("--window") < text.index("--last")
    result = runner.invoke(demo, ["--window", "8", "--no-strict", "--bias", "0.5"])
    assert result.exit_code == 0, result.output
    assert seen == [{"window": 8, "strict": False, "bias": 0.5}]
    result = runner.invoke(demo, ["--window", "many"])
    assert result.exit_code == 2 and "'--window'" in result.output


def test_methods_sharing_an_option_must_agree_on_its_flag():
    first = MethodSpec(name="a", summary="", prompts={}, default_prompt="", readout="hidden",
                       options=(OptionSpec("window", int, 4, "", flag="window size."),))
    second = MethodSpec(name="b", summary="", prompts={}, default_prompt="", readout="hidden",
                        options=(OptionSpec("window", str, "4", "", flag="window size."),))
    assert [o.name for o in flag_options({"a": first})] == ["window"]
    with pytest.raises(RuntimeError, match="window"):
        flag_options({"a": first, "b": second})


# -- settings dataclasses are their commands' options -------------------------------------------------

GENERATED = {("serve",): ServeConfig, ("embed-corpus",): CorpusOptions, ("triton", "build"): ServingOptions}


@pytest.mark.parametrize("path, settings", list(GENERATED.items()), ids=[" ".join(p) for p in GENERATED])
def test_each_generated_option_has_its_fields_default_and_help(path, settings):
    """One source per option: the option's default is the dataclass field's (as the command line
    spells it, where the field parses text), its help is the field's, and no old name hides."""
    params = _click_params(app, *path)
    fields = flags_of(settings)
    assert len(fields) >= 10
    for name, (field, flag) in fields.items():
        param = params[name]
        default = param.default  # type: ignore[attr-defined]
        if flag.parse is not None:
            default = flag.parse(default)
        if flag.many:
            default = tuple(default or ())
        assert default == field.default, (path, name, param.default)  # type: ignore[attr-defined]
        assert param.help == flag.help and flag_name(settings, name) in param.opts, (path, name)  # type: ignore[attr-defined]
    assert not [p for p in params.values() if getattr(p, "hidden", False)], path


@pytest.mark.parametrize("args, old, new", [
    (["serve", "a", "--max-batch-size", "8"], "--max-batch-size", "--batch-size"),
    (["embed-corpus", "a", "-i", "x", "-o", "y", "--batch-tokens", "8"], "--batch-tokens", "--max-batch-tokens"),
    (["embed-corpus", "a", "-i", "x", "-o", "y", "--engine", "ray"], "--engine", "--runner"),
    (["triton", "build", "a", "-o", "y", "--max-tokens", "8"], "--max-tokens", "--max-batch-tokens"),
])
def test_an_old_option_name_is_refused_naming_the_new_one(args, old, new):
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and f"No such option: {old}" in result.output, result.output
    assert new in result.output.split(f"No such option: {old}")[1]


def test_a_settings_dataclass_becomes_options(monkeypatch):
    """Each flag field is an option with its type, default and help; the command receives only what
    was given (text parsed, repeats as a tuple), so the dataclass's defaults apply to the rest."""

    @dataclasses.dataclass(frozen=True)
    class Settings:
        name: str
        rows: int = flag(64, "Rows per batch.")
        size: int = flag("2KB", "Largest body.", parse=parse_size)
        origins: tuple[str, ...] = flag((), "An origin (repeatable).", flags=("--origin",), many=True)
        strict: bool = flag(False, "Refuse long inputs.")
        cut: bool = flag(False, "Cut long inputs.", flags=("--cut/--no-cut",))
        key: Optional[str] = flag(None, "A key.", envvar="KVEMBED_TEST_KEY")

    seen: list[dict] = []

    @dataclass_flags(Settings, "settings")
    def command(first: str = typer.Option("x", "--first"), settings: Given = GIVEN) -> None:
        seen.append(dict(settings))

    demo = typer.Typer(rich_markup_mode=None)
    demo.command()(command)
    text = help_of(demo)
    assert "--rows <int>" in text and "Rows per batch.  [default: 64]" in text and "[default: 2KB]" in text
    assert "--strict " in text and "--no-strict" not in text and "--cut / --no-cut" in text and "--name" not in text
    monkeypatch.delenv("KVEMBED_TEST_KEY", raising=False)
    assert runner.invoke(demo, []).exit_code == 0 and seen[-1] == {}
    assert Settings(name="n", **seen[-1]) == Settings("n", 64, 2000, (), False, False, None)
    result = runner.invoke(demo, ["--rows", "8", "--size", "1MB", "--origin", "a", "--origin", "b", "--strict", "--no-cut"],
                           env={"KVEMBED_TEST_KEY": "k"})
    assert result.exit_code == 0, result.output
    assert seen[-1] == {"rows": 8, "size": 1_000_000, "origins": ("a", "b"), "strict": True, "cut": False, "key": "k"}
    result = runner.invoke(demo, ["--rows", "many"])
    assert result.exit_code == 2 and "'--rows'" in result.output


# -- user errors vs bugs ---------------------------------------------------------------------------

PROGRAM = textwrap.dedent("""
    import sys
    import typer
    from kvembed.cli.support import guard_app, run_app
    from kvembed.errors import InvalidInput, KvembedError

    app = typer.Typer()

    @app.command()
    def boom() -> None:
        print(1 / 0)

    @app.command()
    def refuse() -> None:
        raise InvalidInput("--window must be >= 1, got 0\\nsecond line")

    @app.command()
    def environment() -> None:
        raise KvembedError("no GPU here")

    guard_app(app)
    run_app(app, sys.argv[1:], prog_name="demo")
""")


def run_program(*args: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "KVEMBED_DEBUG"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", PROGRAM, *args], capture_output=True, text=True, env=env, timeout=120)


def test_an_unexpected_exception_is_reported_as_a_bug():
    done = run_program("boom")
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "ZeroDivisionError" in lines[0] and "bug" in lines[0] and "--debug" in lines[0]
    debug = run_program("boom", "--debug")
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "ZeroDivisionError" in debug.stderr


@pytest.mark.parametrize("command, words", [("refuse", "--window must be >= 1, got 0"), ("environment", "no GPU here")])
def test_a_kvembed_error_is_one_line_with_exit_2(command, words):
    done = run_program(command)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"error: {words}"]


def test_invalid_input_is_still_a_value_error():
    assert issubclass(InvalidInput, ValueError) and issubclass(InvalidInput, KvembedError)
    with pytest.raises(ValueError, match="unknown method"):
        from kvembed.methods import get_method

        get_method("no-such-method")


@pytest.mark.parametrize("target, args", [(app, ["export"]), (app, ["embed"])])
def test_method_help_names_every_method_of_the_table(target, args):
    text = re.sub(r"-\s+", "-", " ".join(help_of(target, *args).split()))  # rich wraps lines, also after a hyphen
    assert ", ".join(METHODS) in text, f"--method help of {args} does not list the method table: {text}"
