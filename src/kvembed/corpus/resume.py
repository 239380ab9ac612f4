"""``--resume`` without repeating the options: the run folder's ``_run.json`` records them.

A resume takes every option the interrupted run recorded (:data:`.options.RESUMABLE`); an option
given again must equal the recorded one when it decides what the shards hold
(:data:`.options.RESUME_FIXED`; ``--on-error fail`` may become ``skip``, see :mod:`.output`), and
replaces it when it only says where and how fast the work runs (runner, workers, threads,
provider, batch size). A refusal names both values in one line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from ..flagfields import flag_name
from .options import RESUMABLE, RESUME_FIXED, CorpusError, CorpusOptions
from .output import ON_ERROR_RELAXED, read_output
from .plan import RUN_FILE

#: how the command line spells the options that are not flag fields of :class:`CorpusOptions`
FLAGS = {"artifact": "ARTIFACT", "inputs": "--input"}
#: recorded options that mean something only on the recorded runner: a resume on another runner drops them
RUNNER_BOUND = ("ray_address", "workers")
#: what a run must be given when there is no recorded run to read them from
REQUIRED = ("artifact", "inputs")


def flag(name: str) -> str:
    return FLAGS.get(name) or flag_name(CorpusOptions, name)


def resume_options(output: Path, given: Mapping[str, Any], progress: bool | None = None) -> CorpusOptions:
    """The options of ``--resume`` in ``output``: the recorded ones, with ``given`` (only the options
    the caller passed) checked against them. Without a recorded run, ``given`` must be complete."""
    output = Path(output)
    state = read_output(output)
    recorded = (state.record or {}).get("options")
    if recorded is None:
        missing = [flag(name) for name in REQUIRED if name not in given]
        if missing:
            why = f"holds no {RUN_FILE}" if state.record is None else f"has a {RUN_FILE} without options (an older kvembed wrote it)"
            raise CorpusError(f"--resume: {str(output)!r} {why}; give {' and '.join(missing)} as well")
        return CorpusOptions(**given, output=output, resume=True, progress=progress)
    merged = {name: recorded[name] for name in RESUMABLE if name in recorded}
    if given.get("runner", merged.get("runner")) != merged.get("runner"):
        for name in RUNNER_BOUND:  # the recorded cluster and actor count belong to the recorded runner
            merged.pop(name, None)
    for name, value in given.items():
        if state.shards and name in RESUME_FIXED and name in recorded:
            _check_same(output, name, recorded[name], value)
        merged[name] = value
    return CorpusOptions(**merged, output=output, resume=True, progress=progress)


def _check_same(output: Path, name: str, before: Any, now: Any) -> None:
    """Refuse ``now`` when it would change what the finished shards of ``output`` hold."""
    if name == "artifact":
        now = str(Path(now).resolve())
    elif name == "inputs":
        now = [os.path.abspath(item) for item in ([now] if isinstance(now, (str, os.PathLike)) else now)]
    if now == before or (name == "on_error" and (before, now) == ON_ERROR_RELAXED):
        return
    raise CorpusError(
        f"--resume: {str(output)!r} was started with {_show(name, before)}, not {_show(name, now)}; leave {flag(name)} out to "
        "use the recorded value, or pass --overwrite to start again"
    )


def _show(name: str, value: Any) -> str:
    if value is None:
        return f"no {flag(name)}"
    shown = " ".join(map(str, value)) if isinstance(value, list) else str(value)
    return shown if name == "artifact" else f"{flag(name)} {shown}"
