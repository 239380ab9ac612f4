"""Corpus embedding (``kvembed embed-corpus``): files in, Parquet shards of vectors out.

Runs in one process (``engine="local"``) or on a Ray cluster (``engine="ray"``) over the same
shard plan, so an interrupted run resumes on either engine. Torch-free: it embeds with
:class:`kvembed.runtime.Embedder`; Ray is imported only for ``engine="ray"``.

    from kvembed.corpus import CorpusOptions, embed_corpus
    manifest = embed_corpus(CorpusOptions("artifact/", ["docs/*.parquet"], "vectors/"))
"""

from .options import CorpusError, CorpusOptions
from .run import embed_corpus

__all__ = ["CorpusError", "CorpusOptions", "embed_corpus"]
