"""How to prove a bundle installs with no network: pip told there is no index (and pointed at a
closed loopback port, in case a config re-enables one), and a network namespace with nothing in it
where this process may make one. Used by the bundle's tests and its benchmark alike."""

from __future__ import annotations

import os
import shutil
import subprocess

#: pip settings that leave it only the wheelhouse
OFFLINE_PIP = {"PIP_NO_INDEX": "1", "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_CONFIG_FILE": os.devnull}


def offline_env() -> dict[str, str]:
    """This process's environment without pip settings or an active venv, plus :data:`OFFLINE_PIP`."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_") and key not in ("VIRTUAL_ENV", "PYTHONPATH")}
    return {**env, **OFFLINE_PIP}


def network_cut() -> list[str]:
    """``unshare --net`` as a command prefix where this process may make a namespace, else []."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "--net", "true"], capture_output=True).returncode == 0:
        return [unshare, "--net"]
    return []
