"""The peers' own Python environment: Optimum's exporter and sentence-transformers' ONNX and
OpenVINO backends, in one venv inside the work dir.

Why a venv of their own: ``optimum-onnx`` and ``optimum-intel`` pin ``transformers`` below 4.58,
while kvembed's environment runs transformers 5. The peers get what their users would install
(``pip install optimum-onnx[onnxruntime] optimum-intel[openvino] sentence-transformers``), and
kvembed keeps its own, so neither side runs on the other's versions.

    python benchmarks/peers/peer_venv.py WORK     # -> WORK/optimum-venv, then prints its python
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: the venv's folder name inside the work dir
VENV = "optimum-venv"
#: installed first and alone, a CPU wheel, so nothing later pulls a CUDA build
TORCH = "torch==" + os.environ.get("TORCH_VERSION", "2.13.0")
#: what a user of the peers installs; transformers as the Optimum packages allow it
REQUIREMENTS = ("optimum-onnx[onnxruntime]", "optimum-intel[openvino]", "sentence-transformers",
                "transformers<4.58", "psutil")
#: the packages whose versions a peer's record carries
PACKAGES = ("optimum", "optimum-onnx", "optimum-intel", "sentence-transformers", "transformers", "torch",
            "onnx", "onnxruntime", "openvino", "tokenizers")
#: the modules that must import for the venv to count as built
PROBE = "import optimum.exporters.onnx, optimum.onnxruntime, optimum.intel, sentence_transformers, psutil"


def work_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as an absolute folder outside the repo (the harness never writes into it)."""
    work = Path(path).expanduser().resolve()
    if work == REPO or REPO in work.parents:
        raise SystemExit(f"work dir {work} is inside the repo; pick one outside it")
    return work


def python(work: Path) -> Path:
    """The venv's interpreter."""
    return work / VENV / "bin" / "python"


def ready(work: Path) -> bool:
    """Whether the venv exists and its peers import."""
    exe = python(work)
    return exe.exists() and subprocess.run([str(exe), "-c", PROBE], capture_output=True).returncode == 0


def ensure(work: Path, nice: int = 19) -> Path:
    """Build the venv when it is missing or broken (under ``nice``, pip's output to WORK/optimum-venv.log)."""
    if ready(work):
        return python(work)
    work.mkdir(parents=True, exist_ok=True)
    log = (work / f"{VENV}.log").open("a", encoding="utf-8")
    steps = [
        [sys.executable, "-m", "venv", str(work / VENV)],
        [str(python(work)), "-m", "pip", "install", "-q", "--upgrade", "pip"],
        [str(python(work)), "-m", "pip", "install", TORCH],
        [str(python(work)), "-m", "pip", "install", *REQUIREMENTS],
    ]
    for step in steps:
        print("+", " ".join(step), flush=True)
        subprocess.run(["nice", "-n", str(nice), *step], check=True, stdout=log, stderr=subprocess.STDOUT)
    if not ready(work):
        raise SystemExit(f"{work / VENV} was built but does not import its peers; see {work / VENV}.log")
    return python(work)


def transformers4_copy(source: Path, out: Path) -> Path:
    """``source`` (a folder saved by transformers 5) as transformers 4.x reads it, in ``out``.

    Two things differ, and both would go wrong silently or loudly in the peers' venv: the config's
    ``rope_parameters`` (4.x reads ``rope_theta`` / ``rope_scaling`` and would fall back to the
    architecture's default base, a different model), and the tokenizer class ``TokenizersBackend``
    (4.x: "does not exist"), here ``PreTrainedTokenizerFast`` over the same ``tokenizer.json``.
    The weights and every other file are symlinks, so both sides read the same bytes."""
    out.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        target = out / item.name
        if item.name in ("config.json", "tokenizer_config.json") or target.exists() or target.is_symlink():
            continue
        target.symlink_to(item.resolve())
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    rope = config.pop("rope_parameters", None)
    if rope:
        config["rope_theta"] = rope.get("rope_theta", config.get("rope_theta"))
        if rope.get("rope_type", "default") != "default":
            config["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    tokenizer = source / "tokenizer_config.json"
    if tokenizer.exists():
        settings = json.loads(tokenizer.read_text(encoding="utf-8"))
        if settings.get("tokenizer_class") == "TokenizersBackend":
            settings["tokenizer_class"] = "PreTrainedTokenizerFast"
            settings.pop("backend", None)
        (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    return out


def versions(work: Path) -> dict[str, str]:
    """The installed versions of :data:`PACKAGES` in the venv (the record's ``peer_versions``)."""
    code = ("import json\nfrom importlib import metadata\nout = {}\n"
            f"for name in {PACKAGES!r}:\n"
            "    try:\n        out[name] = metadata.version(name)\n"
            "    except metadata.PackageNotFoundError:\n        pass\nprint(json.dumps(out))")
    return json.loads(subprocess.run([str(python(work)), "-c", code], capture_output=True, text=True,
                                     check=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", help="Work dir outside the repo.")
    args = parser.parse_args()
    work = work_dir(args.work)
    print(ensure(work))
    print(json.dumps(versions(work)))


if __name__ == "__main__":
    main()
