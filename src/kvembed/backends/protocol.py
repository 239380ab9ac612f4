"""The contracts every backend meets, so the runtime never asks which backend it holds.

A *session* (:class:`Session`) is a graph opened on one backend: it names its inputs and what it
runs on, runs feeds to outputs, says how many rows and tokens one call may take (a TensorRT plan's
profiles cap them; the other backends take any shape), and whether the runtime must normalise its
unit vectors again. A *backend module* (:class:`BackendModule`) is the one file that opens such
sessions; the catalogue (:mod:`~kvembed.backends.catalogue`) lists them and is all the runtime reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from ..artifact.engine import Limits
from ..errors import MissingDependency

if TYPE_CHECKING:
    import os

    import numpy as np


@runtime_checkable
class Session(Protocol):
    """What the runtime uses of an opened graph, whatever the backend: five members, as TEI's
    backend trait has (a backend's session may hold more, for its own module's use)."""

    @property
    def name(self) -> str:
        """The target that runs the graph (:data:`~kvembed.backends.targets.TARGETS`), as
        ``Embedder.target`` reports it: ``onnxruntime-cpu``, ``openvino-bf16``, ``tensorrt``; its
        catalogue backend is that target's."""
        ...

    @property
    def input_names(self) -> list[str]:
        """The graph's inputs, in its order (feeds are built for these)."""
        ...

    @property
    def limits(self) -> Limits | None:
        """The shapes it takes (the runtime pads and cuts inputs to them, and cuts calls to
        :meth:`Limits.rows`); None: any shape, any number of rows."""
        ...

    @property
    def renormalise(self) -> bool:
        """Whether the graph's final L2 normalisation may run in 16-bit floats here, so unit vectors
        come back with norms measurably off 1: the runtime normalises those rows again in float32."""
        ...

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        """The arrays of ``output_names`` for one padded batch, on the host, in that order."""
        ...


#: ``probe(provider)``: None when the backend (for that runtime provider, if given) can run here,
#: else why not (and what to install)
Probe = Callable[..., "str | None"]


class BackendModule(Protocol):
    """What one backend file provides; the catalogue's entry names the file and its options
    dataclass (``Embedder.load(options=...)`` passes it through; a ``threads`` field takes the
    ``threads`` argument), and its targets the runtime providers it serves. Optional, each read only
    where present:

    - ``claims(directory) -> bool`` (:func:`~kvembed.artifact.engine.is_engine_dir`, the one engine rule): the
      directory is this backend's own format (a TensorRT engine directory), runs nowhere else, and
      is what ``open_graph`` gets;
    - ``verify_files(directory, manifest)``: its own check of the files it reads, raising with the
      fix (default: the artifact's sha256 check);
    - ``load_warning(directory, session, precision) -> str | None``: a caveat of running an artifact
      of that precision this way (onnxruntime's CPU provider with fp16 weights).
    """

    NAME: str

    def probe(self, provider: str | None = None) -> str | None:
        """None when it can run here (for runtime ``provider``, if given), else why not."""
        ...

    def open_graph(self, path: os.PathLike[str], provider: str, options: Any) -> Session:
        """The graph at ``path`` (a directory for a backend that claims directories) opened for ``provider``."""
        ...

    def weight_factor(self, precision: str, options: Any = None) -> float:
        """Resident bytes per byte of graph file once loaded with ``options``."""
        ...


class BackendUnavailableError(MissingDependency, ValueError):
    """A backend asked for by name is not present on this machine (the message says what to install)."""
