"""``kvembed triton``: write Triton model repositories for artifacts, and serve them locally.

kvembed triton build ARTIFACT... --out REPO   |   kvembed triton serve REPO

Importing this module loads only typer and rich (it is imported by every ``kvembed`` call).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from ..errors import MissingDependency
from ..extras import install_hint
from ..triton.options import ServingOptions
from . import options as opt
from ..signals import sigterm_as_interrupt
from .support import run_guarded

app = typer.Typer(
    add_completion=False, no_args_is_help=True,
    help="Triton Inference Server: write model repositories for artifacts (build), run a local server (serve).",
)
console = Console()


def _needs_tritonclient() -> None:
    try:
        import tritonclient.grpc.model_config_pb2  # noqa: F401
    except ImportError:
        raise MissingDependency(f"kvembed triton needs tritonclient: {install_hint('triton')}") from None


@app.command()
@opt.dataclass_flags(ServingOptions, "settings")
def build(
    artifacts: list[Path] = typer.Argument(..., help="Artifact directories written by kvembed-export."),
    out: Path = typer.Option(..., "--out", "-o", help="Model repository directory to write."),
    name: Optional[list[str]] = typer.Option(None, "--name", help="Ensemble name per artifact, in order (default: the directory name)."),
    settings: opt.Given = opt.GIVEN,
    force: bool = typer.Option(False, "--force", help="Replace --out if it exists."),
) -> None:
    """Write a Triton model repository serving each artifact as an ensemble TEXT (+ KIND) -> embedding."""

    def job() -> Path:
        _needs_tritonclient()
        from ..triton.repository import write_repository

        return write_repository(artifacts, out, name or None, force=force, say=console.print, **settings)

    with sigterm_as_interrupt():  # a scheduler's stop cleans up the staging directory, as Ctrl-C does
        path = run_guarded(job)
    models = sorted(p.name for p in path.iterdir() if p.is_dir())
    console.print(f"wrote {path} ({', '.join(models)}); start Triton on it as {path / 'README.md'} says")


@app.command()
def serve(
    repository: Path = typer.Argument(..., help="Model repository written by kvembed triton build."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind HTTP, gRPC and metrics to (default: this machine only; 0.0.0.0 for every interface)."),
    http_port: int = typer.Option(8000, "--http-port", help="HTTP (KServe v2) port."),
    grpc_port: int = typer.Option(8001, "--grpc-port", help="gRPC port."),
    metrics_port: int = typer.Option(8002, "--metrics-port", help="Prometheus metrics port."),
    python: Optional[Path] = typer.Option(
        None, "--python", help="Python of the stub environment (numpy<2, onnxruntime, tokenizers); default $KVEMBED_TRITON_PYTHON, else this Python."
    ),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds to wait for every model to load."),
) -> None:
    """Run the tritonserver bundled in nvidia-pytriton (python backend only) on REPOSITORY until Ctrl-C;
    HTTP, gRPC and metrics listen on --host, this machine only (127.0.0.1) by default."""
    import signal
    import sys

    class Stopped(BaseException):
        """SIGTERM/SIGINT: stop the server and exit 0, whether it is still loading or serving."""

    def interrupt(signum: int, frame: Any) -> None:
        raise Stopped

    # installed before the server starts: a supervisor may stop us the moment Triton answers ready,
    # before this process has printed its own "ready" line; the caller's handlers come back at the end
    previous = {number: signal.signal(number, interrupt) for number in (signal.SIGTERM, signal.SIGINT)}
    server: Any = None

    def start() -> Any:
        nonlocal server
        _needs_tritonclient()
        from ..triton.server import Ports, TritonServer

        ports = Ports(http_port, grpc_port, metrics_port)
        server = TritonServer(repository, python=python, ports=ports, host=host, log=sys.stderr)
        server.start()
        return server.wait_ready(timeout)

    code = None
    try:
        run_guarded(start)
        console.print(f"Triton ready: {server.endpoints()} (Ctrl-C or SIGTERM stops it)", markup=False, highlight=False, soft_wrap=True)
        while server.alive():
            server.process.wait()
    except Stopped:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stop() drains; a second signal must not cut it short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if server is not None:
            code = server.stop()
        for number, handler in previous.items():
            signal.signal(number, handler)
    if code not in (0, None, -15):
        raise typer.Exit(1)
