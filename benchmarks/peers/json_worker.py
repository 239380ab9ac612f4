"""A peer in a worker process of its own, spoken to in JSON lines: one request, one reply. The
peers' harnesses (``sentence_transformers.py``, ``st_folder.py``) run the library they measure
there, so each side times its own calls in its own process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence


def reply(message: Mapping[str, Any]) -> None:
    """The worker's side: one JSON line on stdout."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class JsonWorker:
    """``command`` as a child process (its stderr into ``log``); :attr:`hello` is its first reply."""

    def __init__(self, command: Sequence[str], log: Path, name: str, env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.log = log.open("w", encoding="utf-8")
        self.process = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                        text=True, env=None if env is None else dict(env))
        self.hello = self.read()

    def read(self) -> dict[str, Any]:
        line = self.process.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise SystemExit(f"the {self.name} worker exited ({self.process.wait()}); see {self.log.name}")
        return json.loads(line)

    def ask(self, **request: Any) -> dict[str, Any]:
        self.process.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        return self.read()

    def close(self) -> None:
        self.process.stdin.close()  # type: ignore[union-attr]
        self.process.wait()
        self.log.close()
