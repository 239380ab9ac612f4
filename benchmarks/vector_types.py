"""What each vector type (float, int8, uint8, binary, ubinary: ``kvembed.runtime.quantize``) costs in
quality and saves in bytes, on the bundled held-out tasks (sample-sts, sample-retrieval) with one
artifact.

    python benchmarks/vector_types.py --artifact artifacts/smollm2-kv --out benchmarks/results/vector-types/smollm2-kv.json

- STS: mteb's main score, Spearman of the gold scores vs each pair's similarity (both sides as
  documents, as ``kvembed eval`` embeds STS). float: the cosine (the vectors are unit rows).
  int8 / uint8, two ways: ``int dot``, the dot product of the integer values as they are (what an
  index of int8 vectors computes), and ``dequantized``, the cosine of the values mapped back to the
  middle of their level (``min + (level + 0.5) * step``). binary / ubinary: Hamming similarity
  (dimensions minus the Hamming distance of the bits; the two types hold the same bits). Also the
  Spearman of each type's similarities vs float's (how well it keeps float's ranking of pairs).
- Retrieval: recall@10 (queries as queries, documents as documents). float: dot product. int8:
  int dot. binary without rescoring: Hamming similarity. binary rescored: the top
  ``--rescore`` documents by Hamming, re-ranked by the float query's dot product with each
  document's bits unpacked (sentence-transformers' ``semantic_search_faiss`` with ``rescore=True``
  unpacks to 0/1; ``unpack_binary`` gives +-1; for one query the two differ by a constant, the
  sum of the query's values, so they rank alike).
- Bytes per vector on the wire, averaged over the retrieval corpus: a JSON list (``json.dumps`` of
  the values: float32 values as Python writes them, integers for the other types), and base64 of the
  raw bytes (float32 little-endian, one byte per int8 / uint8 value, ``ceil(dim / 8)`` bytes binary).

The ranges are the artifact's (its manifest's ``vector_ranges``, or for an artifact from before
them those ``Embedder.vector_ranges`` measures at load: the same texts and computation an export
runs). Harness; targets from the issue: binary recall@10 within 10% of float without rescoring and
2% with it; int8 Spearman within 0.01 of float.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from args import positive

TOP_K = 10


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def dequantized(levels: np.ndarray, ranges: np.ndarray, signed: bool) -> np.ndarray:
    """int8 / uint8 levels back to unit float rows: the middle of each level."""
    step = (ranges[1] - ranges[0]) / 255
    step = np.where(step == 0, 1, step)
    values = ranges[0] + (levels.astype(np.float64) + (128 if signed else 0) + 0.5) * step
    return values / np.linalg.norm(values, axis=-1, keepdims=True)


def int8_like(vectors: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    """The float values int8's levels stand for, unrounded: centred on each dimension's mid-range and
    divided by its step (what an int dot product weighs dimensions by, without the rounding)."""
    step = (ranges[1] - ranges[0]) / 255
    step = np.where(step == 0, 1, step)
    return (vectors - (ranges[0] + ranges[1]) / 2) / step


def bits(packed: np.ndarray) -> np.ndarray:
    raw = (packed.astype(np.int16) + 128).astype(np.uint8) if packed.dtype == np.int8 else packed
    return np.unpackbits(raw, axis=-1)


def hamming_similarity(a: np.ndarray, b: np.ndarray, dim: int) -> np.ndarray:
    """``dim`` minus the Hamming distance, every row of ``a`` against every row of ``b`` (packed rows)."""
    x, y = bits(a)[:, :dim].astype(np.int32), bits(b)[:, :dim].astype(np.int32)
    distance = x @ (1 - y).T + (1 - x) @ y.T
    return dim - distance


def top(scores: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def recall(ranked: np.ndarray, relevant: list[set[int]]) -> float:
    return float(np.mean([len(set(row[:TOP_K].tolist()) & rel) / len(rel) for row, rel in zip(ranked, relevant)]))


def wire_bytes(rows: np.ndarray) -> dict[str, float]:
    """Mean bytes of one vector as a JSON list and as base64 of its raw bytes."""
    as_json = [len(json.dumps(row.tolist())) for row in rows]
    raw = rows.astype("<f4") if rows.dtype.kind == "f" else rows
    as_base64 = [len(base64.b64encode(row.tobytes())) for row in raw]
    return {"json": float(np.mean(as_json)), "base64": float(np.mean(as_base64)), "raw": float(raw[0].nbytes)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifact", type=Path, default=Path("artifacts/smollm2-kv"))
    parser.add_argument("--rescore", type=positive, default=40, help="binary candidates re-ranked by the float query")
    parser.add_argument("--threads", type=positive, default=None)
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the results")
    args = parser.parse_args(argv)

    from kvembed.eval.tasks import load_task, resolve_task_paths
    from kvembed.runtime import Embedder
    from kvembed.runtime.quantize import VECTOR_TYPES, quantize, unpack_binary

    embedder = Embedder.load(args.artifact, provider="cpu", threads=args.threads)
    dim = embedder.dim
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ranges = embedder.vector_ranges()
    ranges_from = "measured at load" if caught else "manifest"
    ranges_s = time.perf_counter() - started
    print(f"ranges: {ranges_from} ({ranges_s:.1f} s)", flush=True)

    sts = load_task(resolve_task_paths(["sample-sts"])[0])
    gold = np.asarray(sts.data["score"], dtype=float)
    first = embedder.encode(list(sts.data["sentence1"]), kind="document")
    second = embedder.encode(list(sts.data["sentence2"]), kind="document")
    retrieval = load_task(resolve_task_paths(["sample-retrieval"])[0])
    doc_ids = list(retrieval.data["corpus"])
    docs = embedder.encode([retrieval.data["corpus"][d]["text"] for d in doc_ids], kind="document")
    query_ids = [q for q in retrieval.data["queries"] if q in retrieval.data["qrels"]]
    queries = embedder.encode([retrieval.data["queries"][q] for q in query_ids], kind="query")
    position = {d: i for i, d in enumerate(doc_ids)}
    relevant = [{position[d] for d, s in retrieval.data["qrels"][q].items() if s > 0} for q in query_ids]

    float_pairs = np.sum(first * second, axis=1)
    float_spearman = spearman(gold, float_pairs)
    report: dict = {"artifact": str(args.artifact), "dim": dim, "ranges": ranges_from, "ranges_seconds": round(ranges_s, 1),
                    "sts_pairs": len(gold), "queries": len(query_ids), "documents": len(doc_ids), "rescore": args.rescore,
                    "sts": {}, "retrieval": {}, "wire_bytes": {}}
    for kind in VECTOR_TYPES:
        a, b = quantize(first, kind, ranges), quantize(second, kind, ranges)
        if kind == "float":
            sims = {"cosine": float_pairs}
        elif kind in ("int8", "uint8"):
            signed = kind == "int8"
            sims = {"int dot": np.sum(a.astype(np.int64) * b.astype(np.int64), axis=1),
                    "dequantized": np.sum(dequantized(a, ranges, signed) * dequantized(b, ranges, signed), axis=1)}
        else:
            sims = {"hamming": np.array([hamming_similarity(x[None], y[None], dim)[0, 0] for x, y in zip(a, b)])}
        if kind == "int8":  # int8's centring and scaling without its rounding: what the int dot measures besides rounding
            sims["centred float dot (no rounding)"] = np.sum(int8_like(first, ranges) * int8_like(second, ranges), axis=1)
        for how, values in sims.items():
            score = spearman(gold, values)
            report["sts"][f"{kind} {how}"] = {"spearman": round(score, 4), "minus_float": round(score - float_spearman, 4),
                                               "spearman_vs_float_similarity": round(spearman(float_pairs, values), 4)}
        report["wire_bytes"][kind] = {key: round(value, 1) for key, value in wire_bytes(quantize(docs, kind, ranges)).items()}

    float_recall = recall(top(queries @ docs.T, TOP_K), relevant)
    int8_docs, int8_queries = quantize(docs, "int8", ranges).astype(np.int64), quantize(queries, "int8", ranges).astype(np.int64)
    packed_docs, packed_queries = quantize(docs, "binary"), quantize(queries, "binary")
    hamming = hamming_similarity(packed_queries, packed_docs, dim)
    candidates = top(hamming, args.rescore)
    unpacked = unpack_binary(packed_docs, dim)
    rescored = np.array([row[np.argsort(-(unpacked[row] @ q), kind="stable")] for row, q in zip(candidates, queries)])
    centred = int8_like(queries, ranges) @ int8_like(docs, ranges).T
    for name, ranked in (("float", top(queries @ docs.T, TOP_K)), ("int8 int dot", top(int8_queries @ int8_docs.T, TOP_K)),
                         ("int8 centred float dot (no rounding)", top(centred, TOP_K)),
                         ("binary hamming", top(hamming, TOP_K)), (f"binary hamming, float rescoring of the top {args.rescore}", rescored)):
        value = recall(ranked, relevant)
        report["retrieval"][name] = {"recall_at_10": round(value, 4), "of_float": round(value / float_recall, 4)}

    binary, binary_rescored = (report["retrieval"][k]["of_float"] for k in list(report["retrieval"])[3:5])
    report["targets"] = {
        "binary recall@10 within 10% of float, no rescoring": binary >= 0.9,
        f"binary recall@10 within 2% of float, rescoring the top {args.rescore}": binary_rescored >= 0.98,
        "int8 Spearman within 0.01 of float (int dot)": abs(report["sts"]["int8 int dot"]["minus_float"]) <= 0.01,
        "int8 Spearman within 0.01 of float (dequantized)": abs(report["sts"]["int8 dequantized"]["minus_float"]) <= 0.01,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")

    print("\n| STS similarity | Spearman | minus float | Spearman vs float's similarities |\n|---|---:|---:|---:|")
    for name, row in report["sts"].items():
        print(f"| {name} | {row['spearman']:.4f} | {row['minus_float']:+.4f} | {row['spearman_vs_float_similarity']:.4f} |")
    print("\n| retrieval | recall@10 | of float |\n|---|---:|---:|")
    for name, row in report["retrieval"].items():
        print(f"| {name} | {row['recall_at_10']:.4f} | {row['of_float']:.4f} |")
    print("\n| type | JSON bytes | base64 bytes | raw bytes |\n|---|---:|---:|---:|")
    for name, row in report["wire_bytes"].items():
        print(f"| {name} | {row['json']:.0f} | {row['base64']:.0f} | {row['raw']:.0f} |")
    print("\ntargets:", json.dumps(report["targets"], indent=1))

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from record import figure, write_record

    def slug(name: str) -> str:
        return re.sub(r"[^a-z0-9]+", "_", name.split(",")[0].lower()).strip("_") + ("_rescored" if "rescoring" in name else "")

    figures = {f"sts_{slug(k)}_spearman": figure(v["spearman"], "spearman") for k, v in report["sts"].items()}
    figures.update({f"recall10_{slug(k)}": figure(v["recall_at_10"], "recall") for k, v in report["retrieval"].items()})
    figures.update({f"wire_{k}_{how}": figure(v[how], "bytes") for k, v in report["wire_bytes"].items() for how in ("json", "base64")})
    write_record("vector_types", figures, source=str(args.out), log="benchmarks/log/vector-types.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
