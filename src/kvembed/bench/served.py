"""A served subject: ``kvembed serve`` in a process of its own, as benchmarks and tests drive it.

The handle a served benchmark needs (start on a free port, wait for ``/health``, read
``/metrics``, peak RSS from the OS, stop with SIGTERM then SIGKILL) in one place, for the
benchmark scripts and the tests alike. Standard library only (``urllib``), so it runs wherever
``kvembed serve`` does; ``/metrics`` is parsed by prometheus_client, which the serve extra installs.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping, Sequence

#: the line ``kvembed serve`` logs once every model serves: the address it really listens on
ANNOUNCED = re.compile(r"kvembed serve: serving (\d+) model\(s\) \((.*)\) on (http://\S+)")

#: {(sample name, sorted labels): value}, as :func:`metrics` reads ``/metrics``
Samples = Mapping[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kvembed_command() -> list[str]:
    """The installed ``kvembed`` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("kvembed")
    return [str(script)] if script.exists() else [shutil.which("kvembed") or "kvembed"]


def http_status(url: str, timeout: float = 2) -> int | None:
    """The status of ``GET url``; None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code
    except (OSError, ValueError):
        return None


class ServerProcess:
    """``kvembed serve ARGS --port P`` in a child process, its output in ``log``. ``port=0`` lets
    the kernel choose: :meth:`wait_healthy` then takes the URL from the server's announcement."""

    def __init__(self, args: Sequence[str], log: Path, env: Mapping[str, str] | None = None, port: int | None = None) -> None:
        self.port = free_port() if port is None else port
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                [*kvembed_command(), "serve", *args, "--port", str(self.port)],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
            )

    def wait_healthy(self, timeout: float = 120) -> "ServerProcess":
        """This server, once ``/health`` answers 200; an error with its log if it exits or stays unready."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"kvembed serve exited with {self.process.returncode}:\n{self.output()}")
            if self.port == 0:  # the address is known once the server says it
                found = ANNOUNCED.search(self.output())
                if found is None:
                    time.sleep(0.1)
                    continue
                self.url = found.group(3)
                self.port = int(self.url.rsplit(":", 1)[1])
            if http_status(f"{self.url}/health") == 200:
                return self
            time.sleep(0.1)
        raise TimeoutError(f"kvembed serve not healthy after {timeout} s:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def rss_kib(self) -> int:
        """The server's resident memory now (Linux: /proc/PID/status)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def stop(self) -> None:
        stop_process(self.process, 30)


def stop_process(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; waits for the exit either way."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` as {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over samples whose labels include ``labels`` (0 when absent)."""
    wanted = set(labels.items())
    return sum(value for (sample, sample_labels), value in samples.items() if sample == name and wanted <= set(sample_labels))

