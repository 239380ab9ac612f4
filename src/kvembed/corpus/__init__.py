"""Corpus embedding (``kvembed embed-corpus``): files in, Parquet shards of vectors out.

Runs in one process (``runner="local"``) or on a Ray cluster (``runner="ray"``) over the same
shard plan, so an interrupted run resumes on either runner. Torch-free: it embeds with
:class:`kvembed.runtime.Embedder`; Ray is imported only for ``runner="ray"``.

    from kvembed.corpus import CorpusOptions, embed_corpus
    manifest = embed_corpus(CorpusOptions("artifact/", ["docs/*.parquet"], "vectors/"))
"""

from ..lazy import lazy_exports

_EXPORTS = {"CorpusError": "options", "CorpusOptions": "options", "embed_corpus": "run"}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
