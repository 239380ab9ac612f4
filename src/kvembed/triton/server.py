"""Run a real ``tritonserver`` locally: the binary bundled in the ``nvidia-pytriton`` wheel.

That wheel carries Triton 2.51 with the python backend only. Using it needs three things this
module does: its bundled libraries on ``LD_LIBRARY_PATH``, the python backend stub built for the
stub environment's Python copied into ``backends/python/``, and ``--backend-directory``. The
python models run in the environment whose ``python3`` is first on ``PATH`` when the server
starts (the *stub environment*); the bundled stub is built against numpy 1, so that environment
needs ``numpy<2`` plus the runtime's onnxruntime and tokenizers. The server starts on free ports
in its own process group and is stopped by its pid. It binds HTTP, gRPC and metrics to one
address, 127.0.0.1 unless told otherwise (tritonserver's own default is every interface).
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Sequence

from ..errors import InvalidInput, KvembedError, MissingDependency

PYTHON_ENV_VAR = "KVEMBED_TRITON_PYTHON"
INSTALL_HINT = "pip install --no-deps nvidia-pytriton==0.7.0 (it carries tritonserver; --no-deps keeps your numpy)"
STUB_PACKAGES = ("numpy", "onnxruntime", "tokenizers")


class TritonServerError(KvembedError, RuntimeError):
    """tritonserver did not come up (it exited, or was not ready in time): see its log."""


@dataclass(frozen=True)
class TritonInstall:
    """Where the wheel put the server, its backends and its shared libraries."""

    binary: Path
    backends: Path
    libraries: Path
    stubs: Path

    def stub_for(self, version: tuple[int, int]) -> Path:
        stub = self.stubs / f"{version[0]}.{version[1]}" / "triton_python_backend_stub"
        if not stub.is_file():
            have = ", ".join(sorted(p.name for p in self.stubs.iterdir() if p.is_dir()))
            raise FileNotFoundError(f"no python backend stub for Python {version[0]}.{version[1]} (the wheel has {have}); use one of those")
        return stub


def find_tritonserver() -> TritonInstall:
    """The ``tritonserver`` of the installed ``nvidia-pytriton`` wheel (found without importing it)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"tritonserver is not installed: {INSTALL_HINT}")
    package = Path(list(spec.submodule_search_locations)[0])
    root = package / "tritonserver"
    install = TritonInstall(
        binary=root / "bin" / "tritonserver",
        backends=root / "backends",
        libraries=package.parent / "nvidia_pytriton.libs",
        stubs=root / "python_backend_stubs",
    )
    for path in (install.binary, install.backends / "python", install.stubs):
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing from the nvidia-pytriton install; reinstall: {INSTALL_HINT}")
    return install


@dataclass(frozen=True)
class StubEnvironment:
    """The Python the python-backend models run in."""

    python: Path
    version: tuple[int, int]

    @property
    def bin_dir(self) -> Path:
        return self.python.parent


def stub_environment(python: str | os.PathLike[str] | None = None) -> StubEnvironment:
    """Check the stub environment (``python``, else $KVEMBED_TRITON_PYTHON, else this Python):
    it must have numpy<2, onnxruntime and tokenizers."""
    chosen = python or os.environ.get(PYTHON_ENV_VAR) or sys.executable
    path = Path(os.path.abspath(chosen))  # absolute (the server runs elsewhere), symlinks kept (a venv's python is one)
    if not path.is_file():
        raise FileNotFoundError(f"stub python {str(path)!r} does not exist; set {PYTHON_ENV_VAR} or --python to a python executable")
    probe = (
        "import json, sys\nfound = {}\nfor name in %r:\n    try:\n        found[name] = __import__(name).__version__\n"
        "    except Exception as err:\n        found[name] = None\nprint(json.dumps([list(sys.version_info[:2]), found]))" % (STUB_PACKAGES,)
    )
    result = subprocess.run([str(path), "-c", probe], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise MissingDependency(f"stub python {path} does not run: {result.stderr.strip()[-300:]}")
    version, found = json.loads(result.stdout.strip().splitlines()[-1])
    missing = [name for name, value in found.items() if value is None]
    fix = f'{path} -m pip install "numpy<2" onnxruntime tokenizers'
    if missing:
        raise MissingDependency(f"the stub python {path} lacks {', '.join(missing)}: {fix}")
    if int(found["numpy"].split(".")[0]) >= 2:
        raise MissingDependency(
            f"the stub python {path} has numpy {found['numpy']}; the bundled python backend stub is built against "
            "numpy 1 (numpy 2 garbles BYTES inputs): make a separate one, e.g. python3.11 -m venv .venv-triton && "
            ".venv-triton/bin/pip install 'numpy<2' onnxruntime tokenizers, and pass --python .venv-triton/bin/python "
            f"(or set {PYTHON_ENV_VAR})"
        )
    return StubEnvironment(path, (int(version[0]), int(version[1])))


def prepare_backend(install: TritonInstall, environment: StubEnvironment) -> None:
    """Copy the stub matching the environment's Python into ``backends/python/`` (once)."""
    stub = install.stub_for(environment.version)
    target = install.backends / "python" / stub.name
    if target.is_file() and target.read_bytes() == stub.read_bytes():
        return
    temporary = target.with_name(target.name + f".{os.getpid()}")
    shutil.copy2(stub, temporary)
    os.replace(temporary, target)


#: where the server listens unless told otherwise: this machine only, as ``kvembed serve``
LOOPBACK = "127.0.0.1"
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def bind_address(host: str) -> Address:
    """``host`` (an IPv4/IPv6 address or a name) as the one numeric address to bind: tritonserver's
    HTTP and metrics servers take numbers only. A name resolving to several takes its first IPv4
    one (``localhost`` is 127.0.0.1, not ::1)."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise InvalidInput(f"--host {host!r} is not an address this machine can resolve ({err.strerror}); give an IP address") from None
    addresses = [ipaddress.ip_address(item[4][0]) for item in found]
    return next((a for a in addresses if a.version == 4), addresses[0])


def http_address(address: Address) -> str:
    """``address`` as ``--http-address`` / ``--metrics-address`` take it (libevhtp: ``ipv6:`` prefix)."""
    return f"ipv6:{address}" if address.version == 6 else str(address)


def grpc_address(address: Address) -> str:
    """``address`` as ``--grpc-address`` takes it (gRPC appends ``:port``, so IPv6 goes in brackets)."""
    return f"[{address}]" if address.version == 6 else str(address)


def host_port(address: Address, port: int) -> str:
    """``address:port``, IPv6 in brackets (as URLs and the gRPC client take it)."""
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


def reachable(address: Address) -> Address:
    """Where a client on this machine reaches a server bound to ``address``: the loopback of the
    same family for a wildcard (0.0.0.0 or ::), else the address itself."""
    if address.is_unspecified:
        return ipaddress.ip_address("::1" if address.version == 6 else LOOPBACK)
    return address


def free_port(host: str = LOOPBACK) -> int:
    with contextlib.ExitStack() as held:
        return _hold_free_port(held, bind_address(host))


@dataclass
class Ports:
    http: int
    grpc: int
    metrics: int

    def __post_init__(self) -> None:
        named = {"--http-port": self.http, "--grpc-port": self.grpc, "--metrics-port": self.metrics}
        for flag, port in named.items():
            if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
                raise InvalidInput(f"{flag} must be in 1-65535, got {port!r}")
        if len(set(named.values())) < len(named):
            raise InvalidInput(f"HTTP, gRPC and metrics need three different ports, got {', '.join(f'{k} {v}' for k, v in named.items())}")

    @classmethod
    def free(cls, host: str = LOOPBACK) -> "Ports":
        """Three ports free on ``host`` now (distinct: each is held while the next is picked)."""
        with contextlib.ExitStack() as held:
            ports = [_hold_free_port(held, bind_address(host)) for _ in range(3)]
        return cls(*ports)


def _hold_free_port(stack: contextlib.ExitStack, address: Address) -> int:
    """A port free on ``address``, its socket kept bound until ``stack`` closes."""
    sock = stack.enter_context(socket.socket(_family(address)))
    sock.bind((str(address), 0))
    return int(sock.getsockname()[1])


def _family(address: Address) -> socket.AddressFamily:
    return socket.AF_INET6 if address.version == 6 else socket.AF_INET


def check_bindable(address: Address, ports: Ports) -> None:
    """Fail in one line, before tritonserver starts, where ``address`` is not this machine's or a
    port on it is taken (tritonserver would exit with its own log lines only)."""
    for name, port in (("HTTP", ports.http), ("gRPC", ports.grpc), ("metrics", ports.metrics)):
        with socket.socket(_family(address)) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Triton's own listeners
            try:
                probe.bind((str(address), port))
            except OSError as err:
                raise TritonServerError(f"cannot serve {name} on {host_port(address, port)}: {err.strerror or err}") from None


class TritonServer:
    """A ``tritonserver`` process on ``repository``: ``start()``, ``wait_ready()``, ``stop()``
    (or use it as a context manager). ``log`` receives the server's stdout and stderr. HTTP, gRPC
    and metrics listen on ``host`` (default 127.0.0.1: this machine only; 0.0.0.0 or :: for every
    interface)."""

    def __init__(
        self,
        repository: str | os.PathLike[str],
        *,
        python: str | os.PathLike[str] | None = None,
        ports: Ports | None = None,
        host: str = LOOPBACK,
        log: IO[str] | None = None,
        extra_args: Sequence[str] = (),
        exit_timeout: int = 10,
    ) -> None:
        self.repository = Path(repository).resolve()
        if not self.repository.is_dir():
            raise FileNotFoundError(f"no model repository at {str(self.repository)!r}; write one with kvembed triton build")
        if not any((model / "config.pbtxt").is_file() for model in self.repository.iterdir()):
            raise FileNotFoundError(
                f"{str(self.repository)!r} is not a model repository (no <model>/config.pbtxt in it); "
                "write one with kvembed triton build ARTIFACT --out DIR and serve DIR"
            )
        self.address = bind_address(host)
        self.install = find_tritonserver()
        self.environment = stub_environment(python)
        self.ports = ports or Ports.free(str(self.address))
        self.log = log
        self.extra_args = list(extra_args)
        self.exit_timeout = int(exit_timeout)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def http_url(self) -> str:
        """``host:port`` a client on this machine sends HTTP requests to."""
        return host_port(reachable(self.address), self.ports.http)

    @property
    def grpc_url(self) -> str:
        """``host:port`` a client on this machine sends gRPC requests to."""
        return host_port(reachable(self.address), self.ports.grpc)

    def endpoints(self) -> str:
        """What the server listens on, as the command line passes it: HTTP, gRPC and metrics."""
        return ", ".join(f"{name} {host_port(self.address, port)}"
                         for name, port in (("HTTP", self.ports.http), ("gRPC", self.ports.grpc), ("metrics", self.ports.metrics)))

    def command(self) -> list[str]:
        return [
            str(self.install.binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={self.install.backends}",
            f"--http-address={http_address(self.address)}",  # tritonserver's default for all three: every interface
            f"--http-port={self.ports.http}",
            f"--grpc-address={grpc_address(self.address)}",
            f"--grpc-port={self.ports.grpc}",
            f"--metrics-address={http_address(self.address)}",
            f"--metrics-port={self.ports.metrics}",
            "--allow-http=true",
            "--allow-grpc=true",
            f"--exit-timeout-secs={self.exit_timeout}",  # how long shutdown waits for in-flight requests and open connections
            *self.extra_args,
        ]

    def environ(self) -> dict[str, str]:
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(self.install.libraries), env.get("LD_LIBRARY_PATH")]))
        env["PATH"] = os.pathsep.join(filter(None, [str(self.environment.bin_dir), env.get("PATH")]))
        env.pop("PYTHONHOME", None)
        env.pop("VIRTUAL_ENV", None)
        return env

    def start(self) -> "TritonServer":
        if self.process is not None:
            raise RuntimeError("this server is already started")
        check_bindable(self.address, self.ports)
        prepare_backend(self.install, self.environment)
        output = self.log if self.log is not None else subprocess.DEVNULL
        self.process = subprocess.Popen(
            self.command(), env=self.environ(), stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
            cwd=self.repository,  # never the caller's directory: a kvembed source tree there would shadow the copy
        )
        return self

    def wait_ready(self, timeout: float = 180.0) -> "TritonServer":
        """Block until ``/v2/health/ready`` answers 200 (every model loaded); TritonServerError if
        the process exits or the timeout passes."""
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(self.http_url)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.process is None or self.process.poll() is not None:
                    code = None if self.process is None else self.process.returncode
                    raise TritonServerError(f"tritonserver exited with code {code} before it was ready (see its log)")
                try:
                    if client.is_server_ready():
                        return self
                except Exception:  # not listening yet
                    pass
                time.sleep(0.25)
        finally:
            client.close()
        raise TritonServerError(f"tritonserver was not ready after {timeout:.0f} s (see its log)")

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM the server (it drains for ``exit_timeout`` s, unloads models and ends its stubs),
        then SIGKILL what remains of its process group: the server if it has not exited ``timeout``
        s later (default: the exit timeout + 30 s), and any stub it left behind; returns the
        server's exit code."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(self.exit_timeout + 30 if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                pass
        # whatever is left of its process group: the server itself past the timeout, or python
        # backend stubs it started and did not end (stopped while loading models, they outlive it)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        return process.returncode

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> "TritonServer":
        self.start()
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
