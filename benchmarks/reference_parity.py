"""Worst cosine of TorchEmbedder vs the independent plain-torch computation, and padding invariance.

Per method x architecture (tiny random models + stories260k); prints a Markdown table.
Run: python benchmarks/reference_parity.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from conftest import ARCHITECTURES, TEXTS, build_tiny_model  # noqa: E402
from test_reference import ALL_METHODS, cosines, independent  # noqa: E402

from kvembed.methods import demo_model_path  # noqa: E402
from kvembed.reference import TorchEmbedder  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        paths = {arch: build_tiny_model(arch, Path(tmp) / arch, seed=i) for i, arch in enumerate(ARCHITECTURES)}
        paths["stories260k"] = demo_model_path()
        print("| method | " + " | ".join(paths) + " |")
        print("|---|" + "---|" * len(paths))
        for method in ALL_METHODS:
            cells = []
            for path in paths.values():
                emb = TorchEmbedder.from_pretrained(path, method)
                expected = np.stack([independent(emb, t) for t in TEXTS])
                batched = {side: None for side in ("right", "left")}
                for side in batched:
                    emb.padding_side = side
                    batched[side] = emb.encode(TEXTS)
                alone = np.stack([emb.encode([t])[0] for t in TEXTS])
                ind = min(cosines(b, expected).min() for b in batched.values())
                pad = min(cosines(b, alone).min() for b in batched.values())
                cells.append(f"{ind:.7f} / {pad:.7f}")
            print(f"| {method} | " + " | ".join(cells) + " |")
        print("\ncells: worst cosine vs independent computation / worst padding invariance (right and left)")


if __name__ == "__main__":
    main()
