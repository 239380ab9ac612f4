"""Print command N (1 or 2) of README.md's Quickstart, so .ci/run runs exactly what a new user does.

The Quickstart is the first ```bash block under '## Quickstart': one command per line.
"""

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def quickstart_commands(text: str) -> list[str]:
    section = text.split("\n## Quickstart", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    if block is None:
        raise SystemExit("README.md: no ```bash block under '## Quickstart'")
    return [line for line in block.group(1).splitlines() if line.strip()]


if __name__ == "__main__":
    commands = quickstart_commands(README.read_text(encoding="utf-8"))
    if len(commands) != 2:
        raise SystemExit(f"README.md's Quickstart has {len(commands)} commands; it must have 2")
    print(commands[int(sys.argv[1]) - 1])
