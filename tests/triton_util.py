"""Helpers for tests/test_triton.py: where the stub environment is, and thin tritonclient calls."""

from __future__ import annotations

import ipaddress
import os
import re
import threading
from pathlib import Path

import numpy as np
import pytest
from checks import assert_same

from kvembed.triton.client import make_client

ROOT = Path(__file__).resolve().parents[1]
#: the stub environment .ci/run builds (numpy<2, onnxruntime, tokenizers; no kvembed)
DEFAULT_STUB_PYTHON = ROOT / ".venv-triton" / "bin" / "python"


def require_tritonserver() -> None:
    """Skip only where the tritonserver binary is absent; anything else wrong fails loudly."""
    from kvembed.triton.server import find_tritonserver

    try:
        find_tritonserver()
    except FileNotFoundError as err:
        pytest.skip(f"no tritonserver here ({err}); .ci/run installs it")


def stub_python() -> Path:
    """$KVEMBED_TRITON_PYTHON, else the repository's .venv-triton (built by .ci/run)."""
    path = Path(os.environ.get("KVEMBED_TRITON_PYTHON") or DEFAULT_STUB_PYTHON)
    if not path.is_file():
        pytest.fail(
            f"tritonserver is installed but its stub python {path} is missing: build it as .ci/run does "
            f"(python3.11 -m venv .venv-triton && .venv-triton/bin/pip install 'numpy<2' onnxruntime tokenizers) "
            "or set KVEMBED_TRITON_PYTHON"
        )
    return path


def assert_close(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    """The issue's bar: tests/checks.py's fp32 "the same" (per-row cosine >= 0.99999), float32, and
    max abs <= 1e-5 (tighter than checks.py's 1e-4: the server runs the very graph of the oracle)."""
    assert_same(got, want, "fp32", what)
    assert got.dtype == np.float32, (what, got.dtype)
    assert float(np.abs(got - want).max()) <= 1e-5, (what, float(np.abs(got - want).max()))


class Clients:
    """Makes tritonclient clients for a server and closes them all afterwards (an open keep-alive
    connection would hold the server's shutdown for its whole exit timeout)."""

    def __init__(self, server) -> None:
        self.server = server
        self.made: list = []
        self.lock = threading.Lock()

    def __call__(self, protocol: str):
        client = make_client(protocol, self.server)
        with self.lock:
            self.made.append(client)
        return client

    def close(self) -> None:
        for client in self.made:
            client.close()
        self.made.clear()


def listening_sockets(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` listens on: its socket inodes matched in
    its /proc/net/tcp and tcp6, so what the kernel has bound, not what the server says it bound."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                found.add((_proc_address(address), int(port, 16)))
    return found


def _proc_address(text: str) -> str:
    """/proc/net/tcp's hex address (32-bit words in host order, little-endian here) -> its text
    form; an IPv4-mapped IPv6 one (gRPC binds 127.0.0.1 as ::ffff:127.0.0.1) as the IPv4 it is."""
    raw = bytes.fromhex(text)
    address = ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)))
    return str(getattr(address, "ipv4_mapped", None) or address)


def child_pids(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (read from /proc/*/stat)."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # gone meanwhile
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(entry.name))
    return children


def announced_endpoints(output: str) -> set[tuple[str, int]]:
    """(address, port) of every "HTTP/gRPC/metrics ADDRESS:PORT" in ``kvembed triton serve``'s
    output (lines joined first: the console may wrap them)."""
    text = " ".join(output.split())
    return {(address.strip("[]"), int(port)) for address, port in
            re.findall(r"(?:HTTP|gRPC|metrics) (\[[0-9a-fA-F:.]+\]|[0-9.]+):(\d+)", text)}
