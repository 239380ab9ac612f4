"""The graph's weights on disk: inline in ``model.onnx`` or in ``model.onnx.data`` beside it, and
writing a graph one weight at a time, so a conversion never holds every weight at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from .layout import MODEL_DATA

DATA_FILE = MODEL_DATA
#: from this many weight bytes on, an artifact's weights go to DATA_FILE (the exporter's own
#: intermediate graphs always keep them there). protobuf cannot hold 2 GiB at all, and well below
#: that an inline graph is copied several times wherever it is read whole (onnx.load, onnx's
#: checker, onnxruntime's parse), while external weights are read one tensor at a time or
#: memory-mapped (benchmarks/log/export-memory-4b.md, "Export memory"). Small graphs stay one file.
EXTERNAL_DATA_THRESHOLD = 256 * 1024**2
#: tensors smaller than this stay inside the graph file when the weights are external
EXTERNAL_MIN_BYTES = 1024


def weight_bytes(model: Any) -> int:
    """Bytes of ``model``'s initializers (an ``onnx.ModelProto``, external ones counted by their length)."""
    return sum(tensor_bytes(t) for t in model.graph.initializer)


class Scratch:
    """Buffers reused from one tensor to the next while weights stream: a fresh array per weight
    costs the kernel a page fault per 4 KiB to zero (most of a conversion's time, measured), a
    reused one costs nothing. :meth:`array` gives an array over the buffer of ``key``, grown to
    the largest asked for; it is valid until the next request for the same key."""

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def array(self, key: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        buffer = self._buffers.get(key)
        if buffer is None or buffer.nbytes < size:
            self._buffers[key] = buffer = np.empty(max(size, 1), dtype=np.uint8)
        return buffer[:size].view(dtype).reshape(shape)


#: ``transform(tensor, values, scratch)``: the values to store for ``tensor``, or None to keep them
Transform = Callable[[Any, "np.ndarray | None", Scratch], "np.ndarray | None"]


def stream_initializers(model: Any, source_dir: Path, target: Path, transform: Transform | None = None,
                        sources: Mapping[str, Path] | None = None, advance: Any = None) -> int:
    """Write ``model`` (an ``onnx.ModelProto`` loaded without its external data, whose weights live
    in ``source_dir``, or for the tensors named in ``sources`` in the directory given there) as
    ``target``, its weights in ``<target>.data``, one tensor at a time, so no more than one weight
    is ever in memory. ``advance(done, total)`` is told the tensors handled so far. Returns the
    bytes written to the data file.

    ``transform(tensor, values, scratch)`` sees each initializer (the TensorProto: its name, which
    it may change, type and dims) with its values (an array it may change in place, valid until it
    returns; None for a placeholder that has none) and returns the values to store (the tensor
    takes their dtype and shape; an array from ``scratch`` is fine) or None to store them as they
    are. A weight goes from the source file into a reused buffer and from the stored array to the
    target file with no copy between: protobuf never holds it (a message keeps its fields in an
    arena until the message is gone)."""
    import onnx

    data = target.with_name(target.name + ".data")
    scratch = Scratch()
    total = len(model.graph.initializer)
    with open(data, "wb") as sink:
        for done, tensor in enumerate(model.graph.initializer, 1):
            values = read_values(tensor, (sources or {}).get(tensor.name, source_dir), scratch)
            if transform is not None:
                changed = transform(tensor, values, scratch)
                values = values if changed is None else changed
            if values is not None:
                _store(tensor, values, sink, data.name)
            del values
            if advance is not None:
                advance(done, total)
    del scratch
    onnx.save_model(model, str(target))
    return data.stat().st_size


_DATA_FIELDS = ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")


def read_values(tensor: Any, directory: Path, scratch: Scratch | None = None) -> np.ndarray | None:
    """``tensor``'s values, an array the caller may change: an external one read from its file in
    ``directory`` straight into an array (``scratch``'s buffer ``"read"`` when given), an inline
    one as onnx gives it (small), a placeholder without data as None."""
    import onnx
    from onnx import helper, numpy_helper

    dims = tuple(int(d) for d in tensor.dims)
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        info = {entry.key: entry.value for entry in tensor.external_data}
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        values = np.empty(dims, dtype=dtype) if scratch is None else scratch.array("read", dims, dtype)
        view = values.reshape(-1).view(np.uint8)
        length = int(info.get("length", view.nbytes))
        if length != view.nbytes:
            raise ValueError(f"external data of {tensor.name} holds {length} bytes, its type and shape need {view.nbytes}")
        with open(Path(directory) / info["location"], "rb") as source:
            source.seek(int(info.get("offset", 0)))
            if source.readinto(view) != length:
                raise ValueError(f"external data of {tensor.name} ends early in {info['location']}")
        return values
    if not any(tensor.HasField(f) if f == "raw_data" else len(getattr(tensor, f)) for f in _DATA_FIELDS) and \
            int(np.prod(dims, dtype=np.int64)) > 0:
        return None  # a placeholder the transform fills
    return numpy_helper.to_array(tensor).copy()  # writable, as an external tensor's is


def load_with_weights(path: str | Path) -> Any:
    """``path``'s graph (an ``onnx.ModelProto``) with its external weights read in by
    :func:`read_values`. ``onnx.load`` refuses a data file with several hard links, which
    ``kvembed triton build`` and ``kvembed bundle`` make of an artifact's weights; an artifact's
    files are checked by their sha256 instead (:func:`kvembed.artifact.check_intact`)."""
    import onnx

    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            tensor.raw_data = read_values(tensor, path.parent).tobytes()
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
    return model


def _store(tensor: Any, values: np.ndarray, sink: Any, location: str) -> None:
    """Make ``tensor`` hold ``values``: appended to ``sink`` (the data file named ``location``)
    from :data:`EXTERNAL_MIN_BYTES` on, inline below."""
    import onnx
    from onnx import helper

    values = np.require(values, requirements="C")  # ascontiguousarray would make a scalar 1-D
    for field in _DATA_FIELDS:
        tensor.ClearField(field)
    del tensor.external_data[:]
    tensor.data_type = helper.np_dtype_to_tensor_dtype(values.dtype)
    del tensor.dims[:]
    tensor.dims.extend(values.shape)
    if values.nbytes >= EXTERNAL_MIN_BYTES:
        offset = sink.tell()
        sink.write(values.reshape(-1).view(np.uint8))
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(values.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        tensor.data_location = onnx.TensorProto.EXTERNAL
    else:
        tensor.raw_data = values.tobytes()
        tensor.data_location = onnx.TensorProto.DEFAULT


def settle_layout(path: Path) -> bool:
    """Give the artifact's graph at ``path`` (weights external) its layout: weights inside
    ``model.onnx`` below :data:`EXTERNAL_DATA_THRESHOLD`, in ``model.onnx.data`` from there on.
    Returns whether the weights stay external."""
    import onnx

    data = path.with_name(path.name + ".data")
    if not data.exists():
        return False
    if data.stat().st_size >= EXTERNAL_DATA_THRESHOLD:
        return True
    model = onnx.load(str(path))  # a small graph: its weights fit twice over
    onnx.save_model(model, str(path))
    data.unlink()
    return False


def keep_external(path: Path) -> None:
    """Store the graph at ``path``'s weights in ``<name>.data`` whatever their size (a no-op when
    they are there already): a second graph file can then read the same bytes instead of carrying
    its own copy (an int8 artifact's OpenVINO graph)."""
    import onnx

    data = path.with_name(path.name + ".data")
    if data.exists():
        return
    model = onnx.load(str(path))  # weights inside: below the threshold, small enough to hold
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data.name,
                    size_threshold=1024)


def save_model(model: Any, path: Path) -> bool:
    """Save an ``onnx.ModelProto`` as ``path``, weights in ``<name>.data`` when it would pass 2 GB."""
    import onnx

    size = sum(tensor_bytes(t) for t in model.graph.initializer)
    external = size >= EXTERNAL_DATA_THRESHOLD
    if external:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + ".data",
            size_threshold=1024,
        )
    else:
        onnx.save_model(model, str(path))
    return external


def tensor_bytes(tensor: Any) -> int:
    """Bytes of an initializer's values: inline, in its external file (its ``length``), or, for
    typed fields and placeholders, its element count times its type's size."""
    import onnx
    from onnx import helper

    if tensor.raw_data:
        return len(tensor.raw_data)
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        for entry in tensor.external_data:
            if entry.key == "length":
                return int(entry.value)
    count = int(np.prod(tensor.dims, dtype=np.int64)) if tensor.dims else 1
    return count * np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
