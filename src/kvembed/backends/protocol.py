"""The one session protocol every backend implements, so the runtime never asks which backend it holds.

A session is a graph opened on one backend: it names its inputs and the backend/provider it runs
on, runs feeds to outputs, and says how many rows one call may take (a TensorRT plan's profiles
cap them; the other backends take any number). A probe says, before any session is made, whether
a backend can run on this machine and, when not, why and what to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping, Protocol, Sequence, runtime_checkable

from ..errors import MissingDependency

if TYPE_CHECKING:
    import numpy as np


@runtime_checkable
class Session(Protocol):
    """What the runtime uses of an opened graph, whatever the backend."""

    #: the catalogue name of the backend: ``"onnxruntime"``, ``"openvino"`` or ``"tensorrt"``
    backend: str

    @property
    def input_names(self) -> list[str]:
        """The graph's inputs, in its order (feeds are built for these)."""
        ...

    @property
    def providers(self) -> list[str]:
        """What it runs on, most specific first: onnxruntime's provider chain
        (``["CUDAExecutionProvider", "CPUExecutionProvider"]``), ``["OpenVINO", precision]`` or
        ``["TensorRT", precision]``."""
        ...

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        """The arrays of ``output_names`` for one padded batch, on the host, in that order."""
        ...

    def max_rows(self, width: int) -> int | None:
        """The most rows one call of ``width`` padded tokens may have; None: any number."""
        ...


#: ``probe()``: None when the backend can run here, else why not (and what to install)
Probe = Callable[[], "str | None"]


class BackendUnavailableError(MissingDependency, ValueError):
    """A backend asked for by name is not present on this machine (the message says what to install)."""
