"""Start and stop llama.cpp's ``llama-server --embedding`` and embed through it the way a user
would: the official ``openai`` client at ``/v1/embeddings``. The peer harness's building block.

    python benchmarks/peers/llama_server.py hf-dir [--model smollm2-135m]
    python benchmarks/peers/llama_server.py smoke --server WORK/build-avx512/bin/llama-server \\
        --gguf WORK/models/smollm2-135m-f16.gguf --gguf WORK/models/smollm2-135m-q8_0.gguf \\
        --compare last=WORK/smollm2-last [--out report.json]

``hf-dir`` prints the Hugging Face folder kvembed dequantises the packaged GGUF into (made on
first use), the input of llama.cpp's ``convert_hf_to_gguf.py``, so both sides start from the same
weights. ``smoke`` starts each GGUF in turn, checks it answers, and compares the first GGUF's
vectors (and token ids) with kvembed artifacts of the same pooling. It times nothing: speed is
measured elsewhere, on a quiet machine.

What the server answers: ``/v1/embeddings`` returns one pooled vector per input, L2-normalised
by default (``--embd-normalize 2``; ``-1`` turns it off, and a request may override it with an
``embd_normalize`` field, sent here through the client's ``extra_body``). The raw text is
tokenised with the GGUF's own special-token rules (``tokenizer.ggml.add_bos_token``), with no
prompt or chat template around it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

#: short texts for the smoke check: plain sentences, punctuation, digits (pre-tokenisers differ
#: on digit runs), non-ASCII, a one-word input and a leading space
SMOKE_TEXTS: tuple[str, ...] = (
    "The cat sat on the mat.",
    "A quick brown fox jumps over the lazy dog.",
    "How do I reset my password?",
    "Embeddings map text to vectors.",
    "Paris is the capital of France.",
    "The meeting was moved to Thursday afternoon.",
    "Water boils at 100 degrees Celsius at sea level.",
    "She bought 3 apples and 12 oranges in 2024.",
    "Is this product available in blue?",
    "Machine learning models need data.",
    "Café au lait, s'il vous plaît!",
    "The stock market fell sharply today.",
    "hello",
    " leading space and trailing dot.",
    "Quantum computers use qubits instead of bits.",
    "Please send the report by Friday, thanks.",
)

POOLINGS = ("none", "mean", "cls", "last", "rank")


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now, so parallel runs do not collide on a fixed one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ServerDied(RuntimeError):
    """llama-server exited before or while answering; carries the exit status and the log tail,
    because a crash at start-up (a signal, e.g. SIGSEGV) is a result the harness must report."""

    def __init__(self, message: str, returncode: int | None, log_tail: str) -> None:
        super().__init__(f"{message}\n--- llama-server log tail ---\n{log_tail}")
        self.returncode = returncode
        self.log_tail = log_tail

    @property
    def signal_name(self) -> str | None:
        """``SIGSEGV`` etc. when the server was killed by a signal (a negative return code)."""
        if self.returncode is not None and self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None


@dataclass
class LlamaServer:
    """One ``llama-server --embedding`` process on a local port.

    ``threads`` is ``-t`` (``-tb`` follows it), ``ubatch`` is ``-ub``: an embedding input must fit
    in one micro-batch, so it caps the longest text in tokens (``-b`` is raised to match).
    ``parallel`` is ``-np``, the number of slots (inputs processed together); ``ctx_size`` is ``-c``,
    split across the slots (0: every slot gets the model's 8192, so KV memory grows with -np).
    ``nice`` runs the server under ``nice -n`` (None: as is)."""

    binary: Path
    model: Path
    pooling: str = "last"
    threads: int = 2
    ubatch: int = 512
    parallel: int = 1
    ctx_size: int = 0
    normalize: int = 2
    host: str = "127.0.0.1"
    port: int | None = None
    nice: int | None = None
    extra_args: Sequence[str] = ()
    log_path: Path | None = None
    startup_timeout: float = 120.0
    process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _log: Any = field(default=None, init=False, repr=False)

    def command(self) -> list[str]:
        """The exact argv, so a report can show how the peer was run."""
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        argv = [
            str(self.binary), "-m", str(self.model), "--embedding", "--pooling", self.pooling,
            "--host", self.host, "--port", str(self.port),
            # -b = -ub: for embeddings the server lowers n_batch to n_ubatch anyway (with a warning)
            "-t", str(self.threads), "-b", str(self.ubatch), "-ub", str(self.ubatch),
            "-np", str(self.parallel), "-c", str(self.ctx_size),
            "--embd-normalize", str(self.normalize),
            "--no-webui",
        ]
        argv += list(self.extra_args)
        if self.nice is not None:
            argv = ["nice", "-n", str(self.nice)] + argv
        return argv

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "LlamaServer":
        """Launch and block until ``/health`` says ok; a process that dies first raises ServerDied."""
        import httpx

        if self.port is None:
            self.port = free_port(self.host)
        log_path = self.log_path or Path(os.environ.get("TMPDIR", "/tmp")) / f"llama-server-{self.port}.log"
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            self.check_alive("exited during start-up")
            try:
                response = httpx.get(f"{self.base_url}/health", timeout=2.0)
                if response.status_code == 200:  # 503 while the model loads
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"llama-server not healthy within {self.startup_timeout:.0f} s; log: {log_path}")

    def check_alive(self, what: str = "exited") -> None:
        """Raise ServerDied when the process has exited (crashes show up here, not as HTTP errors)."""
        if self.process is not None and self.process.poll() is not None:
            raise ServerDied(f"llama-server {what} with status {self.process.returncode}", self.process.returncode, self.log_tail())

    def log_tail(self, lines: int = 25) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def client(self) -> Any:
        """The official OpenAI client pointed at this server (llama-server ignores the key)."""
        from openai import OpenAI

        return OpenAI(base_url=f"{self.base_url}/v1", api_key="sk-no-key", max_retries=0, timeout=600.0)

    def embed(self, texts: Sequence[str], normalize: int | None = None) -> np.ndarray:
        """Vectors for ``texts`` in input order, one request, float32 ``(n, dim)``.

        ``encoding_format="float"`` is explicit: the client would otherwise ask for base64.
        ``normalize`` overrides the server's ``--embd-normalize`` for this request."""
        extra = {} if normalize is None else {"embd_normalize": normalize}
        try:
            response = self.client().embeddings.create(
                model=self.model.name, input=list(texts), encoding_format="float", extra_body=extra or None
            )
        except Exception:
            self.check_alive("died while embedding")
            raise
        rows = sorted(response.data, key=lambda item: item.index)
        return np.asarray([row.embedding for row in rows], dtype=np.float32)

    def tokenize(self, text: str) -> list[int]:
        """The ids the server feeds the model for ``text`` (special tokens added as for embeddings)."""
        import httpx

        response = httpx.post(f"{self.base_url}/tokenize", json={"content": text, "add_special": True}, timeout=60.0)
        response.raise_for_status()
        return [int(t) for t in response.json()["tokens"]]

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 10 s; returns the exit status."""
        code = None
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(10)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            code = self.process.returncode
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def __enter__(self) -> "LlamaServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def kvembed_hf_dir(model: str = "smollm2-135m") -> Path:
    """kvembed's dequantised HF folder of ``model`` (a packaged GGUF alias or a GGUF path)."""
    from kvembed.modeling.gguf import materialize
    from kvembed.modeling.sources import locate_model

    source = locate_model(model)
    if source.gguf is None:
        raise SystemExit(f"{model!r} is no GGUF model; give convert_hf_to_gguf.py its folder directly")
    return materialize(Path(source.location), source.gguf)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine, so normalisation on either side does not matter."""
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.sum(a * b, axis=1)


def kvembed_side(artifact: Path, texts: Sequence[str], threads: int) -> tuple[np.ndarray, list[list[int]]]:
    """kvembed's vectors and token ids for ``texts`` from an exported artifact (CPU)."""
    from kvembed import Embedder

    embedder = Embedder.load(artifact, provider="cpu", threads=threads)
    vectors = embedder.encode(list(texts), normalize=True)
    ids = [list(item.ids) for item in embedder.encoder.encode(list(texts))]
    return vectors, ids


def build_facts(binary: Path) -> dict[str, Any]:
    """``--version`` and the CPU flags the binary was built with (written by llama_cpp.sh): the
    server's log does not print its ISA at the default verbosity."""
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    flags = binary.resolve().parent.parent / "kvembed-peer-flags.txt"
    return {"binary": str(binary), "version": (version.stdout + version.stderr).strip().splitlines()[-2:],
            "cmake_flags": flags.read_text().split() if flags.is_file() else None}


def smoke(args: argparse.Namespace) -> dict[str, Any]:
    """Start every GGUF in turn with every compared pooling; see the module docstring."""
    texts = list(SMOKE_TEXTS)
    compare = dict(item.split("=", 1) for item in args.compare)
    poolings = list(compare) or [args.pooling]
    report: dict[str, Any] = {"texts": texts, "runs": [], "server": build_facts(Path(args.server))}
    reference: dict[str, np.ndarray] = {}
    kv: dict[str, tuple[np.ndarray, list[list[int]]]] = {
        pooling: kvembed_side(Path(path), texts, args.threads) for pooling, path in compare.items()
    }
    for index, gguf in enumerate(args.gguf):
        for pooling in poolings:
            run: dict[str, Any] = {"gguf": str(gguf), "pooling": pooling}
            server = LlamaServer(Path(args.server), Path(gguf), pooling=pooling, threads=args.threads,
                                 ubatch=args.ubatch, parallel=args.parallel, nice=args.nice,
                                 log_path=Path(args.log_dir) / f"{Path(gguf).stem}-{pooling}.log" if args.log_dir else None)
            try:
                server.start()
                try:
                    run["command"] = server.command()
                    vectors = server.embed(texts)
                    raw = server.embed(texts[:2], normalize=-1)
                    ids = [server.tokenize(t) for t in texts]
                    run.update(started=True, dim=int(vectors.shape[1]),
                               norms=[round(float(n), 6) for n in np.linalg.norm(vectors, axis=1)],
                               raw_norms=[round(float(n), 4) for n in np.linalg.norm(raw, axis=1)],
                               first_ids=ids[:3])
                    if index == 0:
                        reference[pooling] = vectors
                    else:
                        cos = cosine_rows(vectors, reference[pooling])
                        run["cos_vs_first_gguf"] = {"min": float(cos.min()), "mean": float(cos.mean())}
                    if pooling in kv:
                        kv_vectors, kv_ids = kv[pooling]
                        cos = cosine_rows(vectors, kv_vectors)
                        same = [a == b for a, b in zip(ids, kv_ids)]
                        run["cos_vs_kvembed"] = {"min": float(cos.min()), "mean": float(cos.mean()),
                                                 "per_text": [round(float(c), 6) for c in cos]}
                        run["same_token_ids"] = sum(same)
                        run["token_id_mismatches"] = [
                            {"text": t, "llama": a, "kvembed": b} for t, a, b, s in zip(texts, ids, kv_ids, same) if not s
                        ]
                finally:
                    run["exit"] = server.stop()  # -15 (SIGTERM) is a clean stop
            except ServerDied as err:
                run.update(started=False, returncode=err.returncode, signal=err.signal_name, log_tail=err.log_tail)
            report["runs"].append(run)
            print(json.dumps({k: v for k, v in run.items() if k not in ("log_tail", "per_text")}, default=str), flush=True)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    hf = sub.add_parser("hf-dir", help="print kvembed's dequantised HF folder of a GGUF model")
    hf.add_argument("--model", default="smollm2-135m")
    sm = sub.add_parser("smoke", help="start each GGUF, embed the smoke texts, compare with kvembed")
    sm.add_argument("--server", required=True, help="llama-server binary")
    sm.add_argument("--gguf", action="append", required=True, help="GGUF file; the first is the reference")
    sm.add_argument("--compare", action="append", default=[], metavar="POOLING=ARTIFACT",
                    help="a kvembed artifact of the same pooling, e.g. last=WORK/smollm2-last")
    sm.add_argument("--pooling", default="last", choices=POOLINGS, help="pooling when nothing is compared")
    sm.add_argument("--threads", type=int, default=2)
    sm.add_argument("--ubatch", type=int, default=512)
    sm.add_argument("--parallel", type=int, default=1)
    sm.add_argument("--nice", type=int, default=19, help="niceness of the servers (a smoke check, not a benchmark)")
    sm.add_argument("--log-dir", default=None)
    sm.add_argument("--out", default=None, help="write the full report (per-text cosines, logs) as JSON")
    args = parser.parse_args(argv)
    if args.command == "hf-dir":
        print(kvembed_hf_dir(args.model))
        return 0
    if args.log_dir:
        Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    report = smoke(args)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    return 0 if all(run.get("started") for run in report["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
