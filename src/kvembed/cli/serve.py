"""``kvembed serve``: the command. Heavy imports (FastAPI, uvicorn, onnxruntime) happen inside it."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import typer

from ..errors import InvalidInput
from ..serve.config import ServeConfig
from ..status import waiting
from . import options as opt
from .status import Waits
from .support import fail

if TYPE_CHECKING:
    from ..runtime import Embedder
    from ..serve.app import ServerState


@opt.dataclass_flags(ServeConfig, "settings", skip=("ov_precision",))
def serve_command(
    artifacts: list[str] = typer.Argument(..., help="Artifact directories (DIR served as its folder name, or NAME=DIR)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (default: this machine only)."),
    port: int = typer.Option(8080, help="TCP port."),
    settings: opt.Given = opt.GIVEN,
    ov_precision: opt.OvPrecision = None,
    keep_alive: float = typer.Option(60.0, help="Seconds an idle kept-alive connection stays open (uvicorn's default, 5, races busy clients reusing it)."),
    graceful_timeout: float = typer.Option(30.0, help="On SIGTERM, answer requests still running after this many seconds with 503 and exit (0: wait for them)."),
    access_log: bool = typer.Option(False, "--access-log/--no-access-log", help="Log every request."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
) -> None:
    """Serve artifacts over OpenAI's embeddings API (POST /v1/embeddings), with /health, /v1/models, /metrics."""
    try:
        with waiting("loading the server (FastAPI, uvicorn)"):
            from uvicorn.config import LOG_LEVELS

            from ..backends.targets import check_provider
            from ..serve.config import parse_artifact
            from ..serve.server import DrainingServer  # noqa: F401  (fail here, not later, without the serve extra)
    except ImportError as err:
        from ..errors import MissingDependency
        from ..extras import install_hint

        raise MissingDependency(f"kvembed serve needs the serve extra: {install_hint('serve')} ({err})") from None

    provider = settings.get("provider", ServeConfig.provider)
    check_provider(provider, "--provider")  # before binding (the artifacts load after)
    opt.check_ov_precision(provider, ov_precision)
    if log_level not in LOG_LEVELS:
        raise InvalidInput(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}")
    if not 0 <= port <= 65535:
        raise InvalidInput(f"--port must be in 0-65535, got {port}")
    for flag, seconds in (("--keep-alive", keep_alive), ("--graceful-timeout", graceful_timeout)):
        if seconds is not None and seconds < 0:
            raise InvalidInput(f"{flag} must be >= 0 seconds, got {seconds}")
    config = ServeConfig(artifacts=tuple(parse_artifact(a) for a in artifacts), ov_precision=ov_precision, **settings)
    with Waits(spinner=False):  # whole lines among uvicorn's log lines, also on a terminal
        run(config, host, port, graceful_timeout, access_log, log_level, keep_alive)


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket for uvicorn, created with ``proto=IPPROTO_TCP``.

    Accepted connections inherit ``proto`` from the listener, and asyncio turns on TCP_NODELAY
    only for sockets whose ``proto`` is IPPROTO_TCP; with the default 0, Nagle's algorithm holds
    each response's body behind its headers until the client's delayed ACK on every kept-alive
    request after the first (uvicorn#3149; benchmarks/log/serve.md, "TCP_NODELAY" under "`kvembed
    serve` vs in-process `Embedder.encode`")."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def run(config: "ServeConfig", host: str, port: int, graceful_timeout: float, access_log: bool, log_level: str, keep_alive: float = 60.0) -> None:
    """Check the artifacts, bind, load them in the background, say where it serves once they are
    ready, serve until SIGTERM/SIGINT; a damaged artifact, a taken port or a failed load exits 2."""
    import uvicorn

    from ..serve.app import create_app, load_embedders, log
    from ..serve.preflight import check_artifacts
    from ..serve.server import DrainingServer, exit_without_joining, header_deadline

    with waiting(f"checking the sha256 of the files of {len(config.artifacts)} artifact(s)"):
        checked = check_artifacts(config)  # before the bind: a broken artifact never starts a server
    try:  # bind here, so a taken port is one line and exit 2 (uvicorn would log and exit 1)
        sock = listening_socket(host, port)
    except OSError as err:
        raise fail(f"cannot serve on {host}:{port}: {err.strerror or err}") from None
    url = bound_url(sock)
    failure: list[str] = []
    server: DrainingServer

    def on_load_error(message: str) -> None:
        failure.append(message)
        server.should_exit = True

    def on_ready(state: "ServerState") -> None:
        names = [f"{name} on {served.embedder.target}" for name, served in state.models.items()]
        for name, served in state.models.items():
            log.info("kvembed serve: %s: %s", name, served.embedder.runtime_line())
        log.info("kvembed serve: serving %d model(s) (%s) on %s", len(names), ", ".join(names), url)

    def load_checked(checked_config: "ServeConfig") -> "dict[str, Embedder]":  # the files were hashed by check_artifacts
        return load_embedders(checked_config, verify=False, checked=checked)

    app = create_app(config, loader=load_checked, on_load_error=on_load_error, on_ready=on_ready)
    state = app.state.kvembed
    uvicorn_config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, access_log=access_log,
        timeout_graceful_shutdown=graceful_timeout or None, timeout_keep_alive=keep_alive, lifespan="on",
        http=header_deadline(config.read_timeout, state.metrics.timeouts.labels("headers").inc),
    )

    server = DrainingServer(uvicorn_config, lambda: state.drain(graceful_timeout))
    server.run(sockets=[sock])
    if failure:
        raise fail(failure[0])
    if state.abandoned:  # graph calls past the graceful timeout: exit now rather than join their threads
        exit_without_joining()


def bound_url(sock: socket.socket) -> str:
    """``http://HOST:PORT`` of a bound socket: the port the kernel gave (``--port 0``), IPv6 in brackets."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
