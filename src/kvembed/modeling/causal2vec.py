"""The local Causal2Vec checkpoint layout, read and checked without torch.

::

    CHECKPOINT/
      causal2vec.json         placeholder token, EOS, prompt templates per kind, encoder max length
      encoder/                a Hugging Face BERT-style model + tokenizer.json (the bidirectional encoder)
      projector.safetensors   fc1.weight [d, k], fc1.bias [d], fc2.weight [d, d], fc2.bias [d]
      llm/                    the decoder (LoRA merged), or the base decoder when adapter/ is present
      adapter/                optional: a peft LoRA adapter of llm/, merged at load

``causal2vec.json``::

    {"format": "kvembed-causal2vec/1", "placeholder": "<s>", "eos": "</s>",
     "templates": {"query": "Instruct: ...\\nQuery: {context}{text}", "document": "{context}{text}"},
     "encoder_max_length": 512}

``{context}`` marks the placeholder the Contextual token replaces (before ``{text}``); ``eos`` is
appended to every prompt (the paper's ``[I; C; T; EOS]``); ``k`` is the encoder's hidden size and
``d`` the LLM's. Every problem is one line naming the file and the fix.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..artifact.staging import check_output, staged
from ..methods.architectures import architecture_of
from ..methods.registry import CAUSAL2VEC_DOCUMENT, CAUSAL2VEC_QUERY
from ..errors import InvalidInput

CONFIG = "causal2vec.json"
PROJECTOR = "projector.safetensors"
FORMAT = "kvembed-causal2vec/1"
PROJECTOR_KEYS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


def is_checkpoint(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / CONFIG).is_file()


@dataclass(frozen=True)
class Causal2VecCheckpoint:
    """A checked checkpoint directory: its parts and the method options its config implies."""

    root: Path
    config: Mapping[str, Any]
    encoder_hidden: int
    llm_hidden: int

    @property
    def encoder(self) -> Path:
        return self.root / "encoder"

    @property
    def llm(self) -> Path:
        return self.root / "llm"

    @property
    def adapter(self) -> Path | None:
        path = self.root / "adapter"
        return path if path.is_dir() else None

    @property
    def projector(self) -> Path:
        return self.root / PROJECTOR

    @property
    def encoder_max_length(self) -> int:
        return int(self.config.get("encoder_max_length", 512))

    def method_options(self) -> dict[str, Any]:
        """The ``causal2vec`` method options this checkpoint fixes."""
        templates = self.config.get("templates") or {}
        return {
            "placeholder": str(self.config["placeholder"]),
            "eos": str(self.config.get("eos") or ""),
            "query_template": str(templates.get("query", CAUSAL2VEC_QUERY)),
            "document_template": str(templates.get("document", CAUSAL2VEC_DOCUMENT)),
        }

    @classmethod
    def read(cls, root: str | os.PathLike[str]) -> "Causal2VecCheckpoint":
        """Open and check ``root``; ValueError / FileNotFoundError with one line naming the problem."""
        root = Path(root)
        where = f"Causal2Vec checkpoint {str(root)!r}"
        if not (root / CONFIG).is_file():
            raise FileNotFoundError(f"{where} has no {CONFIG}; write one with `kvembed causal2vec assemble` (see its --help)")
        try:
            config = json.loads((root / CONFIG).read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise InvalidInput(f"{where}: {CONFIG} is not valid JSON ({err})") from None
        if not isinstance(config, dict) or not isinstance(config.get("placeholder"), str) or not config["placeholder"]:
            raise InvalidInput(f"{where}: {CONFIG} must be an object with a non-empty 'placeholder' token")
        if config.get("format", FORMAT) != FORMAT:
            raise InvalidInput(f"{where}: {CONFIG} has format {config.get('format')!r}; this kvembed reads {FORMAT!r}")
        for part in ("encoder", "llm"):
            if not (root / part / "config.json").is_file():
                raise FileNotFoundError(f"{where} has no {part}/config.json; {part}/ must hold a Hugging Face model folder")
        if not (root / "encoder" / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{where} has no encoder/tokenizer.json; save the encoder's fast tokenizer there")
        if not (root / PROJECTOR).is_file():
            raise FileNotFoundError(f"{where} has no {PROJECTOR} (the MLP from the encoder to the LLM: {', '.join(PROJECTOR_KEYS)})")
        encoder_hidden = _hidden_size(root / "encoder", where)
        llm_hidden = _hidden_size(root / "llm", where)
        shapes = projector_shapes(root / PROJECTOR)
        missing = [key for key in PROJECTOR_KEYS if key not in shapes]
        if missing:
            raise InvalidInput(f"{where}: {PROJECTOR} lacks {', '.join(missing)}; it holds {', '.join(sorted(shapes)) or 'nothing'}")
        d, k = llm_hidden, encoder_hidden
        want = {"fc1.weight": (d, k), "fc1.bias": (d,), "fc2.weight": (d, d), "fc2.bias": (d,)}
        for key, shape in want.items():
            if tuple(shapes[key]) != shape:
                raise InvalidInput(
                    f"{where}: {PROJECTOR} {key} is {list(shapes[key])}, expected {list(shape)} for an encoder of width "
                    f"{k} and an LLM of width {d}; the projector does not fit these models"
                )
        return cls(root, config, encoder_hidden, llm_hidden)


def _hidden_size(folder: Path, where: str) -> int:
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    size = config.get("hidden_size") or (config.get("text_config") or {}).get("hidden_size")
    if not isinstance(size, int):
        raise InvalidInput(f"{where}: {folder.name}/config.json has no hidden_size")
    return size


def projector_shapes(path: Path) -> dict[str, list[int]]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            return {key: list(handle.get_slice(key).get_shape()) for key in handle.keys()}
    except Exception as err:  # a truncated or foreign file
        raise InvalidInput(f"{path} is not a readable safetensors file ({type(err).__name__}: {err})") from None


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def assemble(
    encoder: str | os.PathLike[str],
    llm: str | os.PathLike[str],
    out: str | os.PathLike[str],
    seed: int = 0,
    placeholder: str | None = None,
    eos: str | None = None,
    templates: Mapping[str, str] | None = None,
    force: bool = False,
) -> Causal2VecCheckpoint:
    """Write an *untrained* checkpoint (random projector, seeded) from an encoder and an LLM
    folder, for testing a deployment pipeline before a trained one exists.

    ``placeholder`` defaults to the LLM tokenizer's BOS (the paper's choice for Llama and
    Mistral), else its EOS; ``eos`` to its EOS token."""
    encoder, llm, out = Path(encoder), Path(llm), Path(out)
    for part, folder in (("encoder", encoder), ("llm", llm)):
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"--{part} {str(folder)!r} is not a Hugging Face model folder (no config.json)")
    llm_config = json.loads((llm / "config.json").read_text(encoding="utf-8"))
    try:
        architecture_of(llm_config)
    except ValueError as err:
        raise InvalidInput(f"--llm {str(llm)!r}: {err}") from None
    out = check_output(out, force)
    token_config: dict[str, Any] = {}
    if (llm / "tokenizer_config.json").is_file():
        token_config = json.loads((llm / "tokenizer_config.json").read_text(encoding="utf-8"))
    bos, end = _token_text(token_config.get("bos_token")), _token_text(token_config.get("eos_token"))
    placeholder = placeholder or bos or end
    if not placeholder:
        raise InvalidInput(f"{str(llm)!r}: its tokenizer_config.json names no BOS or EOS token; pass --placeholder")
    where = "Causal2Vec checkpoint"
    k, d = _hidden_size(encoder, where), _hidden_size(llm, where)
    rng = np.random.default_rng(seed)
    weights = {
        "fc1.weight": rng.normal(0, k**-0.5, (d, k)).astype(np.float32),
        "fc1.bias": np.zeros(d, np.float32),
        "fc2.weight": rng.normal(0, d**-0.5, (d, d)).astype(np.float32),
        "fc2.bias": np.zeros(d, np.float32),
    }
    from safetensors.numpy import save_file

    config = {
        "format": FORMAT,
        "placeholder": placeholder,
        "eos": end if eos is None else eos,
        "templates": dict(templates or {"query": CAUSAL2VEC_QUERY, "document": CAUSAL2VEC_DOCUMENT}),
        "encoder_max_length": 512,
        "note": f"assembled by kvembed: random projector (seed {seed}), not trained",
    }
    with staged(out) as tmp:  # an earlier out is replaced only once the new checkpoint is whole
        shutil.copytree(encoder, tmp / "encoder")
        shutil.copytree(llm, tmp / "llm")
        save_file(weights, str(tmp / PROJECTOR), metadata={"kvembed": "untrained projector", "seed": str(seed)})
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return Causal2VecCheckpoint.read(out)
