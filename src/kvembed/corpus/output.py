"""The ``--output`` directory: what an earlier run left there, and when a new run may use it.

A run is checked against the directory before anything is written (:func:`check_output`), and
only then starts (:func:`start_output`: ``_run.json`` is written, ``--overwrite`` deletes the
earlier run). Finished shards are what is worth protecting: a directory holding only a run record
(a run that failed before its first shard) never blocks a new run, and a run that fails leaves
no run record behind unless it finished shards (:func:`abandon_output`). Shards are deleted
only on ``--overwrite``, and only shards this tool wrote.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .options import CorpusError, CorpusOptions
from .plan import CONTENT_DEFAULTS, MANIFEST, PARTIAL_MARK, RUN_FILE, SHARD_GLOB, SUCCESS
from .shards import read_stats

#: a run that only ever failed on records: its finished shards hold no bad record, so resuming
#: with --on-error skip writes the rest as a skip run would have (the reverse is refused)
ON_ERROR_RELAXED = ("fail", "skip")


@dataclass
class OutputState:
    """What ``--output`` holds: the run record, this tool's finished shards (name -> statistics),
    ``part-*.parquet`` files that are not this tool's, and whether the run finished."""

    record: dict[str, Any] | None = None
    shards: dict[str, dict[str, Any]] = field(default_factory=dict)
    foreign: list[str] = field(default_factory=list)
    finished: bool = False

    def finished_inputs(self) -> set[str]:
        return {stats["input"] for stats in self.shards.values()}


def read_output(output: Path) -> OutputState:
    """The state of ``output`` (an empty state when it does not exist yet)."""
    if output.exists() and not output.is_dir():
        raise CorpusError(f"--output {str(output)!r} is a file; give a directory")
    state = OutputState()
    if not output.is_dir():
        return state
    state.record = _read_record(output / RUN_FILE)
    for path in sorted(output.glob(SHARD_GLOB)):
        stats = read_stats(path)
        if stats is None:
            state.foreign.append(path.name)
        else:
            state.shards[path.name] = stats
    state.finished = (output / SUCCESS).is_file()
    return state


def check_output(options: CorpusOptions, identity: dict[str, Any]) -> OutputState:
    """Refuse an ``--output`` this run must not touch, naming the way on; writes nothing."""
    output, state = options.output, read_output(options.output)
    where = repr(str(output))
    if state.foreign:
        raise CorpusError(
            f"{where} holds {state.foreign[0]}, a part-*.parquet file not written by kvembed; choose an empty --output"
        )
    if options.overwrite or not state.shards:  # nothing finished: a stale run record is replaced
        return state
    count = f"{len(state.shards)} finished shard{'s' if len(state.shards) != 1 else ''}"
    if not options.resume and state.finished:
        raise CorpusError(f"{where} holds an earlier, finished run; pass --overwrite to replace it, or choose another --output")
    if not options.resume:
        raise CorpusError(
            f"{where} holds an earlier, unfinished run ({count}); pass --resume to finish it, --overwrite to delete "
            "it and start again, or choose another --output"
        )
    if state.record is None:
        raise CorpusError(f"--resume: {where} holds {count} but no {RUN_FILE}; pass --overwrite to delete them and start again")
    problem = resume_problem(state.record, identity, state.finished_inputs())
    if problem is not None:
        raise CorpusError(
            f"--resume: {where} {problem}; resume with the same inputs, artifact and options, pass --overwrite to "
            f"delete its {count} and start again, or choose another --output"
        )
    return state


def resume_problem(previous: dict[str, Any], current: dict[str, Any], finished_inputs: set[str]) -> str | None:
    """Why the run recorded as ``previous`` cannot be resumed as ``current`` (None: it can).

    Besides an exact match, two changes keep every finished shard valid: an input none of
    whose shards is finished may have changed (fixed after a bad record stopped the run), and
    ``--on-error fail`` may become ``skip``.
    """
    for key, value in current.items():
        before = previous.get(key, CONTENT_DEFAULTS.get(key))
        if key == "inputs":
            problem = _inputs_problem(before or [], value, finished_inputs)
        elif before == value or (key == "on_error" and (before, value) == ON_ERROR_RELAXED):
            problem = None
        else:
            problem = f"was started with a different {key.replace('_', ' ')} ({_short(before)} vs now {_short(value)})"
        if problem is not None:
            return problem
    return None


def _inputs_problem(before: list[dict[str, Any]], now: list[dict[str, Any]], finished_inputs: set[str]) -> str | None:
    if [item["path"] for item in before] != [item["path"] for item in now]:
        paths = [item["path"] for item in before]
        return f"was started with different inputs ({_short(paths)} vs now {_short([item['path'] for item in now])})"
    for old, new in zip(before, now):
        if old != new and new["path"] in finished_inputs:
            return (
                f"was started with different inputs: {new['path']} changed ({old['bytes']:,} -> {new['bytes']:,} bytes, "
                f"{old['rows']:,} -> {new['rows']:,} rows) and some of its shards are finished"
            )
    return None


def start_output(output: Path, record: dict[str, Any], state: OutputState, overwrite: bool) -> int:
    """Start the run in ``output``: record it (its identity and the options a resume reads back),
    clear what no longer holds, and with ``overwrite`` delete the earlier run's shards. Returns how
    many shards were deleted."""
    output.mkdir(parents=True, exist_ok=True)
    remove_partials(output)
    (output / SUCCESS).unlink(missing_ok=True)
    deleted = 0
    if overwrite:
        (output / MANIFEST).unlink(missing_ok=True)
        for name in state.shards:
            (output / name).unlink(missing_ok=True)
            deleted += 1
    if overwrite or state.record != record:
        _write_record(output, record)
    return deleted


def abandon_output(output: Path, created: bool) -> int:
    """After a failed or interrupted run: remove partial files and, when no shard is finished,
    the run record (and ``output`` itself if this run created it), so nothing blocks a new run.
    Returns the number of finished shards kept."""
    remove_partials(output)
    kept = finished_count(output)
    if kept == 0:
        (output / RUN_FILE).unlink(missing_ok=True)
        if created and not any(output.iterdir()):
            output.rmdir()
    return kept


def finished_count(output: Path) -> int:
    """How many finished shards of this tool ``output`` holds."""
    return sum(1 for path in output.glob(SHARD_GLOB) if read_stats(path) is not None)


def interrupted_advice(output: Path) -> str:
    """What an interrupted run left in ``output`` (after :func:`abandon_output`) and how to go on:
    read from the folder itself, so it holds however far the run had got."""
    where = str(output)
    if not output.is_dir():
        return f"no shard was finished, so nothing was kept (no {where} is left); run the same command again to start over"
    kept = finished_count(output)
    if kept == 0:
        return f"no shard was finished, so nothing was kept in {where}; run the same command again to start over"
    count = f"{kept} finished shard{'s are' if kept != 1 else ' is'}"
    return f"{count} kept in {where}; run `kvembed embed-corpus --resume -o {shlex.quote(where)}` to finish"


def remove_partials(output: Path) -> None:
    """Delete half-written files (a killed writer's ``*.partial-*``): never a finished shard."""
    for stale in output.glob(f"*{PARTIAL_MARK}*"):
        stale.unlink(missing_ok=True)


def _read_record(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise CorpusError(f"{path} is not readable JSON; pass --overwrite to start the run again") from None


def _write_record(output: Path, record: dict[str, Any]) -> None:
    partial = output / (RUN_FILE + PARTIAL_MARK + str(os.getpid()))
    partial.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, output / RUN_FILE)


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 120 else text[:117] + "..."


#: repeated ids a summary names by value
DUPLICATE_EXAMPLES = 5


def duplicate_ids(output: Path, shards: list[str]) -> dict[str, Any]:
    """Ids that more than one row of the output carries (``--id-column`` names a column its author
    meant to be unique; nothing else checks): how many ids, how many rows, a few examples. Reads
    the id column only, one shard at a time."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    ids = pa.concat_arrays([chunk for name in shards for chunk in pq.read_table(output / name, columns=["id"]).column("id").chunks])
    counts = pc.value_counts(ids) if len(ids) else pa.array([], pa.struct([("values", ids.type), ("counts", pa.int64())]))
    repeated = [item for item in counts.to_pylist() if item["counts"] > 1]
    return {"count": len(repeated), "rows": sum(item["counts"] for item in repeated),
            "examples": [item["values"] for item in repeated[:DUPLICATE_EXAMPLES]]}
