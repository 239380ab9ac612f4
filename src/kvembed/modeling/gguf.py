"""GGUF checkpoints (llama.cpp / Ollama files) as kvembed models.

A ``.gguf`` file is read once by transformers' GGUF loader (dequantized to fp32), re-saved as a
plain Hugging Face folder (``config.json``, ``model.safetensors``, tokenizer files taken from the
GGUF) in a cache directory keyed by the file's sha256, and loaded from there like any model
folder: the second load takes seconds. transformers flags a GGUF-loaded model as quantized and
refuses ``save_pretrained``, so the folder is written from a fresh model of the same config with
the dequantized state dict loaded into it.

The header facts (architecture, layer count, quantization type) come from the ``gguf`` package
without torch, so a GGUF of an unsupported architecture or a damaged file fails in a second with
one line. Requires ``pip install 'kvembed[gguf]'`` (gguf, accelerate).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from ..artifact.staging import staged, write_text_atomic
from ..status import waiting
from ..cache import cache_root
from ..errors import KvembedError, MissingDependency
from ..extras import install_hint
from ..methods.architectures import BY_GGUF_NAME, UNLOADABLE_GGUF

SUFFIX = ".gguf"
#: written last into a cache folder: its presence means the folder is complete
MARKER = "kvembed-gguf.json"


class GGUFError(KvembedError, ValueError):
    """A damaged GGUF file or one kvembed cannot use; the message names the file."""


@dataclass(frozen=True)
class GGUFInfo:
    """What the header of a GGUF file says, plus its identity."""

    file: str
    sha256: str
    architecture: str
    model_type: str
    num_layers: int
    quantization: str
    name: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def find_gguf(path: str | os.PathLike[str]) -> Path | None:
    """The GGUF file ``path`` names: the file itself, or the single ``.gguf`` in a folder without a
    ``config.json``; None when ``path`` is no GGUF. A folder with several is an error naming them."""
    path = Path(path).expanduser()
    if path.is_file():
        return path if path.suffix.lower() == SUFFIX else None
    if path.is_dir() and not (path / "config.json").is_file():
        found = sorted(p for p in path.iterdir() if p.suffix.lower() == SUFFIX and p.is_file())
        if len(found) > 1:
            names = ", ".join(p.name for p in found)
            raise GGUFError(f"{str(path)!r} holds several GGUF files ({names}); pass one of them with --model")
        return found[0] if found else None
    return None


def gguf_module() -> Any:
    try:
        import gguf
    except ImportError as err:
        raise MissingDependency(f"GGUF models need the gguf package: {install_hint('gguf')} ({err})") from None
    return gguf


def gguf_field(reader: Any, gguf: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    value = field.parts[field.data[0]]
    if field.types and field.types[0] == gguf.GGUFValueType.STRING:
        return bytes(value).decode("utf-8", errors="replace")
    values = value.tolist()
    return values[0] if len(values) == 1 else values


@dataclass(frozen=True)
class GGUFHeader:
    """The header facts kvembed reads before loading: every scalar field (arrays such as the
    vocabulary left out) and each tensor's element count."""

    fields: dict[str, Any]
    tensors: dict[str, int]

    def get(self, key: str) -> Any:
        return self.fields.get(key)


def _remembered(path: Path, kind: str, compute: Any) -> Any:
    """``compute()``'s JSON-able result for file ``path``, remembered in the cache per (path, size,
    mtime) under ``kind``, so a big file is hashed or parsed once, not once per command."""
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    index_path = cache_root() / "gguf" / f"{kind}.json"
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        index = {}
    if key in index:
        return index[key]
    index[key] = compute()
    try:
        index_path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(index_path, json.dumps(index, indent=1))
    except OSError:
        pass  # a read-only cache only costs a second read next time
    return index[key]


def sha256_of(path: Path) -> str:
    """sha256 of ``path``, remembered per (path, size, mtime) in the cache so big files hash once."""

    def digest_file() -> str:
        digest = hashlib.sha256()
        with waiting(f"hashing {path.name} (once per file)"), open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
        return digest.hexdigest()

    return _remembered(path, "hashes", digest_file)


def read_header(path: Path) -> GGUFHeader:
    """The header of GGUF file ``path``, parsed once per file (the gguf package's reader parses
    the whole vocabulary, which takes a while for a large one) and remembered in the cache;
    GGUFError (one line) for a damaged file."""

    def parse() -> dict[str, Any]:
        gguf = gguf_module()
        with waiting(f"reading {path.name}'s header (once per file)"):
            scanned = scan_header(path)
            if scanned is not None:
                return scanned
            reader = _open_reader(path, gguf)  # what the scan does not read: the reader's verdict
            fields = {key: gguf_field(reader, gguf, key) for key, field in reader.fields.items()
                      if field.types and field.types[0] != gguf.GGUFValueType.ARRAY}
            tensors = {tensor.name: int(tensor.n_elements) for tensor in reader.tensors}
        return {"fields": fields, "tensors": tensors}

    return GGUFHeader(**_remembered(path, "headers", parse))


def scan_header(path: Path) -> dict[str, Any] | None:
    """:class:`GGUFHeader`'s facts read straight from a little-endian GGUF v2/v3 file: the gguf
    package's reader builds an array view per vocabulary entry (slow for a large vocabulary), where
    only the scalars are wanted, so arrays are stepped over by their lengths.
    None for anything else (another byte order or version, a damaged or truncated file, a count the
    file cannot hold), which the reader then judges."""
    import mmap
    import struct

    import numpy as np

    gguf = gguf_module()  # its own tables: the value types' little-endian dtypes, the tensor types' sizes
    scalars = {int(kind): np.dtype(dtype).newbyteorder("<") for kind, dtype in gguf.GGUFReader.gguf_scalar_to_np.items()}
    string, array = int(gguf.GGUFValueType.STRING), int(gguf.GGUFValueType.ARRAY)
    quant_sizes = {int(kind): sizes for kind, sizes in gguf.GGML_QUANT_SIZES.items()}
    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            size, at = len(data), 0

            def take(code: str, width: int) -> Any:
                nonlocal at
                if at + width > size:
                    raise ValueError("truncated")
                (value,) = struct.unpack_from("<" + code, data, at)
                at += width
                return value

            def text() -> str:
                nonlocal at
                length = take("Q", 8)
                if at + length > size:
                    raise ValueError("truncated")
                value = bytes(data[at:at + length]).decode("utf-8", errors="replace")
                at += length
                return value

            def scalar(dtype: Any) -> Any:
                nonlocal at
                if at + dtype.itemsize > size:
                    raise ValueError("truncated")
                value = np.frombuffer(data, dtype=dtype, count=1, offset=at)[0].item()
                at += dtype.itemsize
                return value

            def skip_array() -> None:
                nonlocal at
                kind, count = take("I", 4), take("Q", 8)
                if kind == string:
                    if count * 8 > size - at:
                        raise ValueError("array longer than the file")
                    for _ in range(count):
                        length = take("Q", 8)  # (not ``at += take(...)``: that reads ``at`` first)
                        at += length
                elif kind in scalars:
                    at += count * scalars[kind].itemsize
                else:  # arrays of arrays: none in a model header; the reader decides
                    raise ValueError("nested array")
                if at > size:
                    raise ValueError("truncated")

            if bytes(data[:4]) != b"GGUF":
                return None
            at = 4
            version = take("I", 4)
            if version not in (2, 3):
                return None
            tensor_count, field_count = take("Q", 8), take("Q", 8)
            if max(tensor_count, field_count) > size:
                return None
            # the reader's own first three fields, as it names them
            fields: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": tensor_count, "GGUF.kv_count": field_count}
            for _ in range(field_count):
                key, kind = text(), take("I", 4)
                if kind == array:
                    skip_array()
                elif kind == string:
                    fields[key] = text()
                elif kind in scalars:
                    fields[key] = scalar(scalars[kind])
                else:
                    return None
            tensors: dict[str, int] = {}
            end = 0  # where the last tensor's bytes end, from the data section's start
            for _ in range(tensor_count):
                name, dims = text(), take("I", 4)
                if dims > 8:
                    return None
                count = 1
                for _ in range(dims):
                    count *= take("Q", 8)
                kind, offset = take("I", 4), take("Q", 8)
                block, width = quant_sizes[kind]  # KeyError: a type this gguf package does not know
                end = max(end, offset + count // block * width)
                tensors[name] = int(count)
            alignment = int(fields.get("general.alignment") or 32)
            if alignment < 1 or -(-at // alignment) * alignment + end > size:  # a truncated file
                return None
    except (OSError, ValueError, KeyError, struct.error):
        return None
    return {"fields": fields, "tensors": tensors}


def _open_reader(path: Path, gguf: Any) -> Any:
    try:
        return gguf.GGUFReader(str(path), "r")
    except Exception as err:  # the reader raises ValueError/KeyError/IndexError/struct errors on bad bytes
        detail = " ".join(str(err).split())[:200] or type(err).__name__
        raise GGUFError(f"{str(path)!r} is not a readable GGUF file ({detail}); is it complete?") from None


def read_info(path: Path) -> GGUFInfo:
    """Header facts of a GGUF file, plus its identity; GGUFError (one line) for a damaged or
    unsupported one."""
    gguf = gguf_module()
    header = read_header(path)
    architecture = header.get("general.architecture")
    if architecture in UNLOADABLE_GGUF:
        raise GGUFError(
            f"{str(path)!r} is a GGUF of {architecture}, which transformers' GGUF loader does not convert; "
            "pass the model's Hugging Face folder instead"
        )
    if architecture not in BY_GGUF_NAME:
        raise GGUFError(
            f"{str(path)!r} is a GGUF of architecture {architecture!r}; kvembed supports "
            f"{', '.join(sorted(BY_GGUF_NAME))}"
        )
    layers = header.get(f"{architecture}.block_count")
    file_type = header.get("general.file_type")
    try:
        quantization = gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_") if file_type is not None else "unknown"
    except ValueError:
        quantization = f"file_type {file_type}"
    return GGUFInfo(
        file=path.name, sha256=sha256_of(path), architecture=architecture,
        model_type=BY_GGUF_NAME[architecture].model_type, num_layers=int(layers or 0),
        quantization=quantization, name=header.get("general.name"),
    )


def cached_folder(info: GGUFInfo) -> Path:
    return cache_root() / "gguf" / f"{Path(info.file).stem}-{info.sha256[:16]}"


def materialize(path: Path, info: GGUFInfo | None = None) -> Path:
    """The Hugging Face folder of GGUF file ``path``: from the cache, or dequantized into it now."""
    info = info or read_info(path)
    target = cached_folder(info)
    if (target / MARKER).is_file():
        return target
    try:
        import accelerate  # noqa: F401  (transformers' GGUF loader needs it)
    except ImportError as err:
        raise MissingDependency(f"GGUF models need accelerate: {install_hint('gguf')} ({err})") from None
    with waiting(f"dequantizing {path.name} once into {target} (later loads read the cache)"):
        return _dequantize(path, info, target)


@contextlib.contextmanager
def _no_tensor_bar() -> Iterator[None]:
    """Without transformers' per-tensor tqdm bar (it ignores transformers' own progress-bar switch):
    the command line's status line says what runs, and a second live line would garble it."""
    from transformers import modeling_gguf_pytorch_utils as converter

    bar = getattr(converter, "tqdm", None)
    if bar is not None:
        converter.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            converter.tqdm = bar


@contextlib.contextmanager
def _one_reader(path: Path) -> Iterator[None]:
    """transformers reads the GGUF's header anew for the config, the tokenizer and the weights (each
    a parse of the whole vocabulary, seconds for a large one): within a dequantization the gguf
    package's reader of ``path`` is opened once and shared (it only reads its memory map)."""
    gguf = gguf_module()
    original = gguf.GGUFReader
    opened: dict[str, Any] = {}

    def shared(file: Any, mode: str = "r") -> Any:
        if mode != "r" or Path(file).resolve() != path.resolve():
            return original(file, mode)
        if "reader" not in opened:
            opened["reader"] = original(file, mode)
        return opened["reader"]

    gguf.GGUFReader = shared
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _check_names(path: Path, config: Any, state: dict[str, Any], tied: bool) -> None:
    """GGUFError unless ``state`` holds exactly the weights of ``config``'s model (built on the meta
    device: no storage), so a folder that would load with random weights is never written."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        wanted = set(AutoModelForCausalLM.from_config(config).state_dict())
    if tied:
        wanted.discard("lm_head.weight")
    missing, unexpected = sorted(wanted - set(state)), sorted(set(state) - wanted)
    if missing or unexpected:
        raise GGUFError(f"{str(path)!r}: weights do not match the architecture (missing {missing[:3]}, unexpected {unexpected[:3]})")


def _dequantize(path: Path, info: GGUFInfo, target: Path) -> Path:
    """:func:`materialize`'s work: transformers reads the GGUF, the weights are saved into ``target``."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from .quiet import quiet_transformers

    folder, name = str(path.parent), path.name
    try:
        with quiet_transformers(), _no_tensor_bar(), _one_reader(path):
            config = AutoConfig.from_pretrained(folder, gguf_file=name)
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            # the config given: transformers would read the whole header (vocabulary included) again for it
            loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=config, dtype="float32")
    except (ValueError, KeyError, OSError, RuntimeError) as err:
        detail = " ".join(str(err).split())[:200]
        raise GGUFError(f"transformers cannot load {str(path)!r} ({type(err).__name__}: {detail})") from None
    config.architectures = [type(loaded).__name__]
    state = loaded.state_dict()
    tied = bool(getattr(config, "tie_word_embeddings", False))
    if tied:
        state.pop("lm_head.weight", None)  # the embedding's own tensor: written once
    _check_names(path, config, state, tied)
    try:
        with staged(target) as staging:  # an incomplete earlier attempt at target is replaced
            # the loaded tensors written as they are (transformers refuses save_pretrained for a model it
            # flags as quantized): no second model, so one copy of the weights at a time
            save_file({key: value.contiguous() for key, value in state.items()}, str(staging / "model.safetensors"),
                      metadata={"format": "pt"})
            config.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            (staging / MARKER).write_text(json.dumps(info.to_dict(), indent=2), encoding="utf-8")
            staging.chmod(0o755)  # the cache may be shared whatever the umask
    except OSError:
        if (target / MARKER).is_file():  # another process filled the cache at the same time
            return target
        raise
    return target
