"""Helpers for the serve tests beside :mod:`kvembed.bench.served` (the server process, /metrics):
raw sockets for slow uploads, thread priorities, waiting for a condition, in-process oracles."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any, Mapping


def thread_nices(pid: int) -> list[int]:
    """The niceness of every thread of process ``pid`` (Linux: /proc/PID/task/TID/stat, field 19)."""
    nices = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        text = stat.read_text()
        nices.append(int(text[text.rindex(")") + 2 :].split()[16]))
    return nices


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
