"""onnxruntime's OpenVINO execution provider against kvembed's direct OpenVINO runtime (and
onnxruntime's CPU provider), on one artifact and one padded batch, interleaved over rounds.

onnxruntime-openvino replaces the onnxruntime package, so it lives in a venv of its own: pass its
python as --ep-python (that venv needs numpy and tokenizers; kvembed is taken from this checkout).
Every (backend, round) runs in a fresh process: load, one check call, then timed calls.

    python benchmarks/experiments/openvino_ep.py --artifact ART --ep-python /tmp/ortov/bin/python --batch 16 --tokens 128
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, {root!r})
from kvembed import OpenVINOOptions
from kvembed.runtime import Embedder
from kvembed.backends.onnxruntime import session_options
from kvembed.bench.workload import exact_rows, make_batch

backend, artifact, batch, tokens, seconds, out = {args!r}
start = time.perf_counter()
embedder = Embedder.load(artifact, provider="cpu", threads=2, verify=False)
cpu_load = time.perf_counter() - start
feeds = make_batch(embedder.encoder, exact_rows(embedder.encoder, tokens, batch), batch).inputs
start = time.perf_counter()
if backend == "ort-openvino-ep":
    import onnxruntime as ort
    options = session_options(2)
    session = ort.InferenceSession(f"{{artifact}}/model.onnx", options, providers=[("OpenVINOExecutionProvider", {{"device_type": "CPU", "precision": "FP32", "num_of_threads": "2"}}), "CPUExecutionProvider"])
    providers = session.get_providers()
    run = lambda: session.run(["embedding"], feeds)[0]
elif backend == "openvino":
    embedder = Embedder.load(artifact, provider="openvino", threads=2, options=OpenVINOOptions(precision="f32"), verify=False)
    providers = [embedder.target]
    run = lambda: embedder.run(feeds)[0]
else:
    providers = [embedder.target]
    run = lambda: embedder.run(feeds)[0]
load = cpu_load if backend == "onnxruntime-cpu" else time.perf_counter() - start
output = run()
samples = []
begin = time.perf_counter()
while len(samples) < 3 or time.perf_counter() - begin < seconds:
    t = time.perf_counter(); run(); samples.append(time.perf_counter() - t)
real = int(feeds["attention_mask"].sum())
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
np.save(out + ".npy", output)
json.dump({{"backend": backend, "providers": [str(p) for p in providers], "load_s": load, "samples": samples,
            "tokens": real, "peak_rss_mb": int(hwm) / 1024}}, open(out, "w"))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifact", required=True)
    parser.add_argument("--ep-python", required=True, help="python of a venv with onnxruntime-openvino")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {}
    outputs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for backend, python in (("onnxruntime-cpu", sys.executable), ("openvino", sys.executable),
                                    ("ort-openvino-ep", args.ep_python)):
                out = f"{tmp}/{backend}-{round_}.json"
                code = CHILD.format(root=str(ROOT), args=(backend, args.artifact, args.batch, args.tokens, args.seconds, out))
                done = subprocess.run([python, "-c", code], capture_output=True, text=True)
                if done.returncode != 0:
                    runs.setdefault(backend, []).append({"error": done.stderr.strip().splitlines()[-1][:400]})
                    print(backend, "failed:", done.stderr.strip().splitlines()[-1][:400], flush=True)
                    continue
                result = json.loads(Path(out).read_text())
                import numpy as np

                outputs[backend] = np.load(out + ".npy")
                runs.setdefault(backend, []).append(result)
                median = statistics.median(result["samples"])
                print(f"round {round_} {backend:16s} {result['providers']} {median * 1e3:8.1f} ms "
                      f"{result['tokens'] / median:8.0f} tok/s rss {result['peak_rss_mb']:.0f} MB load {result['load_s']:.1f}s", flush=True)
    import numpy as np

    base = outputs.get("onnxruntime-cpu")
    summary = {}
    for backend, results in runs.items():
        good = [r for r in results if "error" not in r]
        if not good:
            summary[backend] = {"error": results[0]["error"]}
            continue
        medians = [statistics.median(r["samples"]) for r in good]
        cos = None
        if base is not None and backend in outputs:
            a, b = outputs[backend], base
            cos = float(np.min(np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)))
        summary[backend] = {"providers": good[0]["providers"], "median_ms": [m * 1e3 for m in medians],
                            "tokens_per_s": [good[0]["tokens"] / m for m in medians],
                            "peak_rss_mb": max(r["peak_rss_mb"] for r in good), "load_s": [r["load_s"] for r in good],
                            "worst_cosine_vs_onnxruntime": cos}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
