"""Helpers for tests/test_serve.py: a real ``kvembed serve`` process on a free port, raw sockets
for slow uploads, /metrics parsing, process memory."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import httpx
from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kvembed_command() -> list[str]:
    """The installed ``kvembed`` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("kvembed")
    return [str(script)] if script.exists() else [shutil.which("kvembed") or "kvembed"]


#: the line ``kvembed serve`` logs once every model serves: the address it really listens on
ANNOUNCED = re.compile(r"kvembed serve: serving (\d+) model\(s\) \((.*)\) on (http://\S+)")


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
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"kvembed serve not healthy after {timeout} s:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def rss_kib(self) -> int:
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


def thread_nices(pid: int) -> list[int]:
    """The niceness of every thread of process ``pid`` (Linux: /proc/PID/task/TID/stat, field 19)."""
    nices = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        text = stat.read_text()
        nices.append(int(text[text.rindex(")") + 2 :].split()[16]))
    return nices


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` as {(sample name, sorted labels): value}."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(samples: Mapping[tuple[str, tuple], float], name: str, **labels: str) -> float:
    """The sum of ``name`` over samples whose labels include ``labels`` (0 when absent)."""
    wanted = set(labels.items())
    return sum(value for (sample, sample_labels), value in samples.items() if sample == name and wanted <= set(sample_labels))


class SlowUpload:
    """A POST whose body is held back: the server has the request (headers and part of the body)
    in flight until :meth:`finish` sends the rest and reads the response."""

    def __init__(self, port: int, path: str, payload: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> None:
        self.body = json.dumps(payload).encode()
        head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", f"Content-Length: {len(self.body)}"]
        head += [f"{key}: {value}" for key, value in (headers or {}).items()]
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + self.body[:10])

    def finish(self) -> tuple[int, dict[str, Any]]:
        self.sock.sendall(self.body[10:])
        with self.sock, self.sock.makefile("rb") as stream:
            status = int(stream.readline().split()[1])
            length = 0
            while (line := stream.readline().strip()):
                key, _, value = line.decode().partition(":")
                if key.lower() == "content-length":
                    length = int(value)
            return status, json.loads(stream.read(length))


def wait_for(condition: Any, timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


def oracle_embedders(artifacts: Mapping[str, Path], cap: int | None = None) -> dict[str, Any]:
    """In-process embedders of a server's artifacts (the tests' oracle), cut at ``cap`` tokens per
    input when the server is capped, as its own embedders are."""
    from kvembed.runtime import Embedder

    embedders = {name: Embedder.load(path, provider="cpu") for name, path in artifacts.items()}
    if cap is not None:
        for embedder in embedders.values():
            embedder.cap_input_tokens(cap)
    return embedders
