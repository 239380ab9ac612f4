"""The graph's weights on disk: inline in ``model.onnx`` or in ``model.onnx.data`` beside it, and
writing a graph one weight at a time, so a conversion never holds every weight at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..artifact import MODEL_DATA

DATA_FILE = MODEL_DATA
#: from this many weight bytes on, an artifact's weights go to DATA_FILE (the exporter's own
#: intermediate graphs always keep them there). protobuf cannot hold 2 GiB at all, and well below
#: that an inline graph is copied several times wherever it is read whole (onnx.load, onnx's
#: checker, onnxruntime's parse), while external weights are read one tensor at a time or
#: memory-mapped (benchmarks/RESULTS.md, "Export memory"). Small graphs stay one file.
EXTERNAL_DATA_THRESHOLD = 256 * 1024**2
#: tensors smaller than this stay inside the graph file when the weights are external
EXTERNAL_MIN_BYTES = 1024


def weight_bytes(model: Any) -> int:
    """Bytes of ``model``'s initializers (an ``onnx.ModelProto``, external ones counted by their length)."""
    return sum(_tensor_bytes(t) for t in model.graph.initializer)


def stream_initializers(model: Any, source_dir: Path, target: Path, transform: Any = None,
                        sources: Mapping[str, Path] | None = None, advance: Any = None) -> int:
    """Write ``model`` (an ``onnx.ModelProto`` loaded without its external data, whose weights live
    in ``source_dir``, or for the tensors named in ``sources`` in the directory given there) as
    ``target``, its weights in ``<target>.data``, one tensor at a time: each is read, passed to
    ``transform(tensor)`` (which may rewrite it in place), appended to the data file and dropped,
    so no more than one weight is ever in memory. ``advance(done, total)`` is told the tensors
    handled so far. Returns the bytes written to the data file."""
    import onnx
    from onnx.external_data_helper import (
        load_external_data_for_tensor, save_external_data, set_external_data, uses_external_data,
    )

    data = target.with_name(target.name + ".data")
    data.write_bytes(b"")
    total = len(model.graph.initializer)
    for done, tensor in enumerate(model.graph.initializer, 1):
        # each weight is handled in a message of its own: protobuf (upb) allocates a message's
        # fields in its arena and frees them only with the message, so bytes set on the model's
        # own tensors would stay allocated, clearing them or not, until the whole model is gone
        work = onnx.TensorProto()
        work.CopyFrom(tensor)
        if uses_external_data(work):
            load_external_data_for_tensor(work, str((sources or {}).get(work.name, source_dir)))
            work.data_location = onnx.TensorProto.DEFAULT
            del work.external_data[:]
        if transform is not None:
            transform(work)
        if work.HasField("raw_data") and len(work.raw_data) >= EXTERNAL_MIN_BYTES:
            set_external_data(work, data.name)
            save_external_data(work, str(target.parent))
            work.ClearField("raw_data")
            work.data_location = onnx.TensorProto.EXTERNAL
        tensor.CopyFrom(work)
        del work
        if advance is not None:
            advance(done, total)
    onnx.save_model(model, str(target))
    return data.stat().st_size


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

    size = sum(_tensor_bytes(t) for t in model.graph.initializer)
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


def _tensor_bytes(tensor: Any) -> int:
    import onnx

    if tensor.raw_data:
        return len(tensor.raw_data)
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        for entry in tensor.external_data:
            if entry.key == "length":
                return int(entry.value)
    dims = int(np.prod(tensor.dims)) if tensor.dims else 1
    return dims * 4
