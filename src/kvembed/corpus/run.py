"""``embed_corpus``: plan, check the inputs and the output, embed the pending shards with the runner, write the run's summary."""

from __future__ import annotations

import time
from contextlib import closing
from pathlib import Path
from typing import Any, Iterator

from ..errors import MissingDependency
from ..extras import install_hint
from .inputs import check_first_records
from .options import CorpusError, CorpusOptions
from .output import abandon_output, check_output, duplicate_ids, start_output
from .plan import Plan, Shard, make_plan, read_artifact
from .progress import CorpusProgress
from .shards import read_stats
from .summary import build_summary, write_summary
from .worker import Job, ShardWorker


def embed_corpus(options: CorpusOptions) -> dict[str, Any]:
    """Embed every record of ``options.inputs`` into Parquet shards under ``options.output``.

    Returns the run's summary (also written to ``_manifest.json``, followed by ``_SUCCESS``). Bad
    input raises :class:`kvembed.corpus.CorpusError` naming the file and row. Everything that can
    be checked up front (inputs, columns, the first records, ``--output``) is checked before the
    run writes its record, so such a failure leaves ``--output`` as it was.
    """
    started = time.monotonic()
    if options.runner == "ray":  # a missing Ray or an unreachable --ray-address fails before the output is touched
        _ray_runner().check_address(options.ray_address)
    artifact, sha256 = read_artifact(options.artifact)
    plan = make_plan(options)
    check_first_records(plan.files, plan.columns, options.on_error)
    identity = plan.identity(options, sha256)
    state = check_output(options, identity)
    job = _job(options, plan)
    # the local runner opens its session before the run writes anything: a backend that cannot open
    # fails with --output untouched, and a Ctrl-C during the load is not a half-made run
    worker = ShardWorker(job) if options.runner == "local" else None
    created = not options.output.exists()
    replaced = start_output(options.output, {**identity, "options": options.resumable()}, state, options.overwrite)
    try:
        stats, resumed = _embed(options, plan, job, worker)
    except BaseException as err:
        kept = abandon_output(options.output, created)
        if isinstance(err, CorpusError) and kept:
            raise CorpusError(f"{err} (then rerun with --resume to keep the {_count(kept)}, or --overwrite to start again)") from err
        raise
    summary = build_summary(options, plan, artifact, sha256, stats, resumed, replaced, time.monotonic() - started)
    if plan.columns.id is not None:  # ids from the input: nothing made them unique
        summary["duplicate_ids"] = duplicate_ids(options.output, [shard.name for shard in plan.shards])
    write_summary(options.output, summary)
    return summary


def _count(shards: int) -> str:
    return f"{shards} finished shard{'s' if shards != 1 else ''}"


def _job(options: CorpusOptions, plan: Plan) -> Job:
    return Job(
        artifact=str(Path(options.artifact).resolve()), threads=options.threads_per_worker, kind=options.kind,
        max_batch_tokens=options.max_batch_tokens, output_dtype=options.output_dtype, on_error=options.on_error,
        columns=plan.columns, files=tuple(plan.files), output=str(Path(options.output).resolve()), provider=options.provider,
        windows=options.windows,
    )


def _embed(options: CorpusOptions, plan: Plan, job: Job, worker: ShardWorker | None) -> tuple[dict[str, dict[str, Any]], int]:
    """Embed the shards not finished yet with the runner: (every shard's statistics, shards resumed)."""
    done = finished_shards(options.output, plan)
    pending = [shard for shard in plan.shards if shard.name not in done]
    stats = dict(done)
    total = sum(f.rows for f in plan.files)
    with CorpusProgress(total, sum(s.stop - s.start for s in plan.shards if s.name in done), options.progress) as progress:
        with closing(_runner(options, job, worker, pending, progress)) as items:  # the runner stops before any cleanup
            for item in items:
                stats[item["shard"]] = item
    return stats, len(done)


def finished_shards(output: Path, plan: Plan) -> dict[str, dict[str, Any]]:
    """Shards already on disk (an earlier, interrupted run) whose statistics match the plan."""
    done = {}
    for shard in plan.shards:
        path = output / shard.name
        stats = read_stats(path) if path.is_file() else None
        expected = (plan.files[shard.file].path, shard.start, shard.stop)
        if stats is not None and (stats.get("input"), stats.get("start"), stats.get("stop")) == expected:
            done[shard.name] = stats
    return done


def _runner(options: CorpusOptions, job: Job, worker: ShardWorker | None, pending: list[Shard],
            progress: CorpusProgress) -> Iterator[dict[str, Any]]:
    if worker is not None:
        from .local import run_local

        yield from run_local(worker, pending, progress)
        return
    ray_runner = _ray_runner()
    with ray_runner.ray_session(options.ray_address):
        yield from ray_runner.run_ray(job, pending, options.workers, progress)


def _ray_runner() -> Any:
    try:
        from . import ray_runner
    except ImportError as err:
        raise MissingDependency(f"--runner ray needs Ray Data: {install_hint('corpus')} ({err})") from None
    return ray_runner
