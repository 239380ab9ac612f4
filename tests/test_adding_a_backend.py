"""Adding a backend is one file and its registry entries (a catalogue entry, its targets, the
provider name that stands for them): this file is that backend.

It is a backend module as :class:`~kvembed.backends.protocol.BackendModule` describes one
(``NAME``, ``probe``, an options dataclass, ``open_graph``, ``weight_factor``), with a real session
that runs the artifact's ONNX graph through a plain onnxruntime ``InferenceSession`` under shape
limits of its own. The tests register it with one catalogue entry and load a real artifact through
``Embedder``, changing nothing else in kvembed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnxruntime
import pytest

from kvembed.backends import catalogue, targets
from kvembed.backends.protocol import Limits, Session
from kvembed.runtime import Embedder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NAME = "stand-in"
#: the shapes the stand-in takes: few rows per call, a floor and a cap on the padded width
LIMITS = Limits(max_batch_size=2, min_sequence=80, max_sequence=128)
TEXTS = ["A man is playing a guitar.", "hi", "Why is the sky blue?", "She said no twice.", "The cat sat on the mat."]


@dataclass(frozen=True)
class StandInOptions:
    """The stand-in's own options: its thread count (``Embedder.load``'s ``threads`` fills it) and a
    setting no other backend has."""

    threads: int | None = None
    spin: bool = False


def probe(provider: str | None = None) -> str | None:
    return None


def weight_factor(precision: str, options: StandInOptions | None = None) -> float:
    return 3.0


class StandInSession:
    """A graph run by a plain onnxruntime session, which records every call's shape."""

    name = f"{NAME}-cpu"
    limits = LIMITS
    renormalise = True

    def __init__(self, path: Path, options: StandInOptions) -> None:
        settings = onnxruntime.SessionOptions()
        settings.intra_op_num_threads = options.threads or 1
        self.options = options
        self.graph = onnxruntime.InferenceSession(str(path), settings, providers=["CPUExecutionProvider"])
        self.calls: list[tuple[int, int]] = []

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.graph.get_inputs()]

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        self.calls.append(next(iter(feeds.values())).shape[:2])
        return self.graph.run(list(output_names), dict(feeds))


def open_graph(path: os.PathLike[str], provider: str, options: StandInOptions) -> StandInSession:
    assert provider == NAME
    return StandInSession(Path(path), options)


@pytest.fixture
def stand_in(monkeypatch):
    """This file registered as a backend: its catalogue entry, its one target, and the provider name
    that is an alias of it; nothing else."""
    monkeypatch.setitem(catalogue.BACKENDS, NAME, catalogue.Backend(NAME, __name__, "StandInOptions"))
    monkeypatch.setitem(targets.TARGETS, f"{NAME}-cpu", targets.Target(f"{NAME}-cpu", NAME))
    monkeypatch.setitem(targets.PROVIDER_TARGETS, NAME, (f"{NAME}-cpu",))


@pytest.fixture(scope="module")
def artifact(stories_artifact):
    return stories_artifact("kv-embedding")


def test_an_artifact_loads_and_embeds_on_a_registered_backend(stand_in, artifact):
    embedder = Embedder.load(artifact, provider=NAME, threads=1, options=StandInOptions(spin=True))
    session = embedder.session
    assert isinstance(session, StandInSession) and isinstance(session, Session)
    assert session.options == StandInOptions(threads=1, spin=True)  # its options pass through, threads filled in
    assert embedder.target == "stand-in-cpu" and catalogue.session_backend(session) == NAME
    assert embedder.runtime_line() == "runtime: stand-in-cpu running the fp32 artifact (provider stand-in, as asked)"
    assert embedder.max_length == LIMITS.max_sequence  # the session's limits reach the encoder
    got = embedder.encode(TEXTS, batch_size=8)
    assert session.calls and all(rows <= LIMITS.max_batch_size and width >= LIMITS.min_sequence for rows, width in session.calls)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    reference = Embedder.load(artifact, provider="cpu", threads=1).encode(TEXTS, batch_size=8)
    np.testing.assert_allclose(got, reference, atol=1e-5)


def test_the_registered_backend_is_a_provider_everywhere_the_catalogue_answers(stand_in, artifact):
    assert NAME in catalogue.providers() and catalogue.provider_problem(NAME) is None
    assert catalogue.backend_for(artifact, NAME) == NAME
    graph = sum(p.stat().st_size for p in Path(artifact).iterdir() if p.name.startswith("model.onnx"))
    assert catalogue.session_memory(artifact, NAME) == int(graph * 3.0 + catalogue.SESSION_OVERHEAD)
    with pytest.raises(ValueError, match="takes StandInOptions, got OnnxRuntimeOptions"):
        Embedder.load(artifact, provider=NAME, options=catalogue.BACKENDS["onnxruntime"].options_type()())


def test_unregistered_it_is_no_provider_and_its_options_are_unknown(artifact):
    with pytest.raises(ValueError, match="provider must be one of auto, cpu, cuda, tensorrt, openvino, got 'stand-in'"):
        Embedder.load(artifact, provider=NAME)
    with pytest.raises(ValueError, match="options= takes a backend's options .* got StandInOptions"):
        Embedder.load(artifact, provider="cpu", options=StandInOptions(spin=True))
