"""``embed_corpus``: plan, prepare the output, run the engine on the pending shards, write the manifest."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator

from ..runtime.artifact import read_manifest
from .manifest import build_manifest, write_manifest
from ..errors import MissingDependency
from .options import CorpusOptions
from .plan import Plan, Shard, artifact_sha256, make_plan, prepare_output
from .progress import CorpusProgress
from .shards import read_stats
from .worker import Job


def embed_corpus(options: CorpusOptions) -> dict[str, Any]:
    """Embed every record of ``options.inputs`` into Parquet shards under ``options.output``.

    Returns the manifest (also written to ``_manifest.json``, followed by ``_SUCCESS``). Bad
    input raises :class:`kvembed.corpus.CorpusError` naming the file and row.
    """
    started = time.monotonic()
    if options.engine == "ray":  # a missing Ray or an unreachable --ray-address fails before the output is touched
        _ray_engine().check_address(options.ray_address)
    sha256 = artifact_sha256(options.artifact)
    artifact = read_manifest(options.artifact)
    plan = make_plan(options)
    prepare_output(options.output, plan.identity(options, sha256), options.resume)
    done = finished_shards(options.output, plan)
    pending = [shard for shard in plan.shards if shard.name not in done]
    job = Job(
        artifact=str(Path(options.artifact).resolve()), threads=options.threads_per_worker, kind=options.kind,
        batch_tokens=options.batch_tokens, output_dtype=options.output_dtype, on_error=options.on_error,
        columns=plan.columns, files=tuple(plan.files), output=str(Path(options.output).resolve()), provider=options.provider,
    )
    stats = dict(done)
    total = sum(f.rows for f in plan.files)
    with CorpusProgress(total, sum(s.stop - s.start for s in plan.shards if s.name in done), options.progress) as progress:
        for item in _engine(options, job, pending, progress):
            stats[item["shard"]] = item
    manifest = build_manifest(options, plan, artifact, sha256, stats, len(done), time.monotonic() - started)
    write_manifest(options.output, manifest)
    return manifest


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


def _engine(options: CorpusOptions, job: Job, pending: list[Shard], progress: CorpusProgress) -> Iterator[dict[str, Any]]:
    if options.engine == "local":
        from .local import run_local

        yield from run_local(job, pending, progress)
        return
    ray_engine = _ray_engine()
    with ray_engine.ray_session(options.ray_address):
        yield from ray_engine.run_ray(job, pending, options.workers, progress)


def _ray_engine() -> Any:
    try:
        from . import ray_engine
    except ImportError as err:
        raise MissingDependency(f"--engine ray needs Ray Data: pip install 'kvembed[corpus]' ({err})") from None
    return ray_engine
