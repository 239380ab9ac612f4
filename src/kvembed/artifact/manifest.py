"""The manifest (``kvembed.json``) as a typed record: what every reader of an artifact relies on.

The exporter writes the JSON; loaders (runtime, server, Triton, bundles, corpus jobs, benchmarks)
read it back through :func:`load_manifest`, once per load, and pass the typed :class:`Manifest`
on: it names a missing or malformed field instead of failing later on a ``KeyError``, and knows
the directory it was read from (:attr:`Manifest.directory`), so no reader opens the file again. Fields added after the first schema get today's default when an
older manifest lacks them (such artifacts computed exactly that default), and fields this kvembed
does not know are kept (:attr:`Manifest.extra`), so a newer exporter's additions pass through.
:attr:`Manifest.raw` is the JSON as read; :meth:`Manifest.to_dict` and :meth:`Manifest.write` give
it back unchanged, with the fields changed since (``dataclasses.replace``) or all fields of a
manifest built in code (:mod:`.jsonform`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from ..methods.spec import ResolvedMethod
from .certificates import Certificate, certificates_of
from .ranges import VectorRange, vector_ranges_of
from .report import ExportReport
from .jsonform import checked_field as _field, field_keys, json_value, over_raw
from .layout import ARTIFACT_FILES, MANIFEST, MODEL, name_problem
from .staging import write_text_atomic
from ..errors import InvalidInput, shown

SCHEMA_VERSION = 1

#: manifest keys every artifact has, from the first schema on (tests and loaders rely on them)
REQUIRED_KEYS = (
    "schema_version",
    "kvembed_version",
    "source",
    "method",
    "dim",
    "max_length",
    "opset",
    "precision",
    "padding_side",
    "placeholder_id",
    "pad_id",
    "fallback_id",
    "inputs",
    "outputs",
    "graph",
    "files",
    "parity",
)
#: keys added since, with the value an artifact without them computed
DEFAULTS: Mapping[str, Any] = {"created": None, "layer_selection": None, "context_encoder": None, "also": {}, "certified": [],
                                 "graphs": {}, "vector_ranges": {}}
PADDING_SIDES = ("left", "right")


def _plain(name: Any, what: str) -> None:
    """Refuse a file name that is not a plain name inside the artifact folder (:func:`~.layout.name_problem`)."""
    problem = name_problem(name)
    if problem is not None:
        raise InvalidInput(f"{what} {problem}: an artifact lists only plain file names in its own folder; "
                           "this one was not written by kvembed-export")


@dataclass(frozen=True)
class FileRecord:
    """One file as the manifest records it (``{"sha256": ..., "bytes": ...}`` in the JSON)."""

    sha256: str
    size: int

    @classmethod
    def from_dict(cls, data: Any, where: str = "a file record") -> "FileRecord":
        if not isinstance(data, Mapping):
            raise InvalidInput(f"{where} must be {{\"sha256\": hex, \"bytes\": size}}, got {data!r}")
        return cls(_field(data, "sha256", str, where), _field(data, "bytes", int, where))

    def to_dict(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "bytes": self.size}


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output. Outputs say whether they are L2-normalised and which method (or
    ``--also`` label) computes them; manifests before ``--also`` did not name the method (None)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]
    normalized: bool | None = None
    method: str | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "TensorSpec":
        if not isinstance(data, Mapping):
            raise InvalidInput(f"{where} must be an object, got {data!r}")
        return cls(
            _field(data, "name", str, where), str(data.get("dtype", "")), tuple(_field(data, "shape", list, where)),
            _field(data, "normalized", bool, where, optional=True), _field(data, "method", str, where, optional=True),
        )

    def to_dict(self) -> dict[str, Any]:
        return over_raw(self, field_keys(TensorSpec), lambda d: TensorSpec.from_dict(d, "a tensor"), skip_none=("normalized", "method"))

    @property
    def width(self) -> int:
        """The last axis (an output's embedding width)."""
        return int(self.shape[-1])


@dataclass(frozen=True)
class ContextEncoder:
    """Causal2Vec's context encoder: its tokenizer file, token limit and pad id."""

    tokenizer: str
    max_length: int
    pad_id: int

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "ContextEncoder":
        if not isinstance(data, Mapping):
            raise InvalidInput(f"{where} must be an object, got {data!r}")
        tokenizer = _field(data, "tokenizer", str, where)
        _plain(tokenizer, f"{where}: tokenizer {shown(tokenizer)}")
        return cls(tokenizer, _field(data, "max_length", int, where), _field(data, "pad_id", int, where))

    def to_dict(self) -> dict[str, Any]:
        return over_raw(self, field_keys(ContextEncoder), lambda d: ContextEncoder.from_dict(d, "context_encoder"))


@dataclass(frozen=True)
class Source:
    """Where the exported model came from. Only ``model`` is in every manifest; the rest is
    None where the exporter of the time did not record it (or for a model built in memory)."""

    model: str = ""
    location: str | None = None
    preset_id: str | None = None
    revision: str | None = None
    model_type: str | None = None
    config_sha256: str | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    #: the dtype the checkpoint's weights are stored in
    dtype: str | None = None
    gguf: Mapping[str, Any] | None = None
    causal2vec: Mapping[str, Any] | None = None
    #: a sentence-transformers folder's export (``st``): its own library against kvembed's reference
    second_reference: Mapping[str, Any] | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "Source":
        if not isinstance(data, Mapping):
            raise InvalidInput(f"{where} must be an object, got {data!r}")
        known = {f.name for f in fields(cls)} - {"raw"}
        return cls(**{key: data[key] for key in known if data.get(key) is not None}, raw=dict(data))

    def to_dict(self) -> dict[str, Any]:
        return over_raw(self, field_keys(Source), lambda d: Source.from_dict(d, "source"))


@dataclass(frozen=True)
class GraphFacts:
    """What the exporter recorded about the graph. ``attention_form`` ("fused" or "decomposed") is
    None in manifests from before the choice existed."""

    attention_form: str | None = None
    #: the oldest runtime versions that run the graph (e.g. ``{"tensorrt": "10.14"}``)
    min_versions: Mapping[str, str] = field(default_factory=dict)
    decoder_layers: int | None = None
    external_data: bool = False
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def conversion(self) -> Mapping[str, Any]:
        """What the fp16 / int8 conversion recorded (``precision_conversion``; empty for fp32)."""
        return self.raw.get("precision_conversion") or {}

    @property
    def session_config(self) -> Mapping[str, str]:
        """onnxruntime session config entries the gate ran the graph with (weight-only int8 pins
        its kernel's arithmetic): a session opened outside kvembed must set them to compute what
        was certified."""
        return dict(self.conversion.get("session_config") or {})

    @property
    def weight_only(self) -> bool:
        """Whether the graph's int8 weights feed float arithmetic (the ``weights`` recipe records
        its block size), not integer kernels."""
        return "block_size" in self.conversion

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "GraphFacts":
        if not isinstance(data, Mapping):
            raise InvalidInput(f"{where} must be an object, got {data!r}")
        attention = data.get("attention") or {}
        layers = data.get("decoder_layers")
        return cls(
            attention.get("form"), dict(attention.get("min_versions") or {}),
            None if layers is None else int(layers), bool(data.get("external_data", False)), dict(data),
        )

    def to_dict(self) -> dict[str, Any]:
        keys = field_keys(GraphFacts, renamed={"attention_form": ("attention", "form"), "min_versions": ("attention", "min_versions")})
        return over_raw(self, keys, lambda d: GraphFacts.from_dict(d, "graph"), skip_none=("attention_form", "decoder_layers"))


def _method(data: Any, where: str) -> ResolvedMethod:
    if not isinstance(data, Mapping):
        raise InvalidInput(f"{where} must be an object, got {data!r}")
    try:
        return ResolvedMethod.from_dict(data)
    except KeyError as err:
        raise InvalidInput(f"{where} lacks {err.args[0]}") from None
    except (TypeError, ValueError) as err:
        raise InvalidInput(f"{where} is malformed: {err}") from None


@dataclass(frozen=True)
class Manifest:
    """An artifact's ``kvembed.json``, checked and typed (see the module docstring)."""

    schema_version: int
    kvembed_version: str
    source: Source
    method: ResolvedMethod
    dim: int
    max_length: int
    opset: int
    precision: str
    padding_side: str
    #: the placeholder token's id (methods that re-route through one), else None
    placeholder_id: int | None
    pad_id: int
    fallback_id: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    graph: GraphFacts
    files: Mapping[str, FileRecord]
    #: the export's report (:class:`~.report.ExportReport`): the parity gate's, typed; None (``{}``
    #: in the JSON) only in the exporter's draft, before its gate ran: an artifact on disk has one
    parity: ExportReport | None
    created: str | None = None
    #: ``--layers auto``: the intrinsic-dimension curve and the set it chose
    layer_selection: Mapping[str, Any] | None = None
    context_encoder: ContextEncoder | None = None
    #: extra methods read from the same forward pass (``--also``): label -> method
    also: Mapping[str, ResolvedMethod] = field(default_factory=dict)
    #: what passed on which backend, precision and CPU (:mod:`.certificates`); none before they existed
    certified: tuple[Certificate, ...] = ()
    #: top-level fields this kvembed does not know (a newer exporter's), kept as they are
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: backend -> the graph file it runs where that is not ``model.onnx`` (:data:`~.layout.OPENVINO_MODEL`)
    graphs: Mapping[str, str] = field(default_factory=dict)
    #: output name -> its vectors' per-dimension ranges (:mod:`.ranges`); none before they were measured
    vector_ranges: Mapping[str, VectorRange] = field(default_factory=dict)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: the artifact directory it was read from (:func:`load_manifest`); None for one built in code
    directory: Path | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: Any, where: str = MANIFEST, directory: str | os.PathLike[str] | None = None) -> "Manifest":
        """Check and type a manifest's JSON; ValueError names what is missing or malformed."""
        if not isinstance(data, Mapping):
            raise InvalidInput(f"{where} does not hold a JSON object")
        version = data.get("schema_version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise InvalidInput(f"{where} has no valid schema_version (got {version!r}); is it a kvembed manifest?")
        if version > SCHEMA_VERSION:
            raise InvalidInput(
                f"{where} has schema_version {version}, newer than this kvembed reads ({SCHEMA_VERSION}): "
                "upgrade kvembed (pip install -U kvembed) to load this artifact"
            )
        if version < SCHEMA_VERSION:
            raise InvalidInput(f"{where} has schema_version {version}, older than {SCHEMA_VERSION}: re-export the model")
        missing = [key for key in REQUIRED_KEYS if key not in data]
        if missing:
            raise InvalidInput(f"{where} lacks {', '.join(missing)}")
        padding_side = _field(data, "padding_side", str, where)
        if padding_side not in PADDING_SIDES:
            raise InvalidInput(f"{where}: padding_side must be one of {', '.join(PADDING_SIDES)}, got {padding_side!r}")
        for key in ("inputs", "outputs"):
            _field(data, key, list, where)
        files = _field(data, "files", dict, where)
        also = _field(data, "also", dict, where, optional=True) or {}
        context = data.get("context_encoder")
        graphs = _field(data, "graphs", dict, where, optional=True) or {}
        for name in files:
            _plain(name, f"{where}: files entry {shown(name)}")
        outputs = tuple(TensorSpec.from_dict(item, f"{where}: outputs[{i}]") for i, item in enumerate(data["outputs"]))
        for backend, name in graphs.items():
            _plain(name, f"{where}: graphs[{shown(backend)}] {shown(name)}")
            if not name.endswith(".onnx"):
                raise InvalidInput(f"{where}: graphs[{shown(backend)}] must be an .onnx file name in the artifact, got {shown(name)}")
        return cls(
            schema_version=version,
            kvembed_version=str(data["kvembed_version"]),
            source=Source.from_dict(data["source"], f"{where}: source"),
            method=_method(data["method"], f"{where}: method"),
            dim=_field(data, "dim", int, where),
            max_length=_field(data, "max_length", int, where),
            opset=_field(data, "opset", int, where),
            precision=_field(data, "precision", str, where),
            padding_side=padding_side,
            placeholder_id=_field(data, "placeholder_id", int, where, optional=True),
            pad_id=_field(data, "pad_id", int, where),
            fallback_id=_field(data, "fallback_id", int, where),
            inputs=tuple(TensorSpec.from_dict(item, f"{where}: inputs[{i}]") for i, item in enumerate(data["inputs"])),
            outputs=outputs,
            graph=GraphFacts.from_dict(data["graph"], f"{where}: graph"),
            files={name: FileRecord.from_dict(record, f"{where}: files[{name!r}]") for name, record in files.items()},
            parity=None if data["parity"] == {} else ExportReport.from_dict(data["parity"], f"{where}: parity"),
            created=data.get("created", DEFAULTS["created"]),
            layer_selection=data.get("layer_selection", DEFAULTS["layer_selection"]),
            context_encoder=None if not context else ContextEncoder.from_dict(context, f"{where}: context_encoder"),
            also={label: _method(method, f"{where}: also[{label!r}]") for label, method in also.items()},
            certified=certificates_of(data.get("certified"), f"{where}: certified"),
            extra={key: value for key, value in data.items() if key not in KNOWN_KEYS},
            graphs=dict(graphs),
            vector_ranges=vector_ranges_of(data.get("vector_ranges"), f"{where}: vector_ranges", outputs),
            raw=data,
            directory=None if directory is None else Path(directory),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (a copy: the writer's to change): as read, with the fields changed since;
        a manifest built in code, from its fields."""
        out = over_raw(self, field_keys(Manifest, without=("raw", "extra", "directory")), Manifest.from_dict)
        for key in [key for key in out if key not in KNOWN_KEYS and key not in self.extra]:
            del out[key]
        out.update(json_value(self.extra))
        return out

    def updated(self, **changes: Any) -> "Manifest":
        """A manifest with some top-level fields replaced (given in their JSON form), checked again."""
        return Manifest.from_dict({**self.to_dict(), **changes}, directory=self.directory)

    def write(self, directory: str | os.PathLike[str] | None = None) -> Path:
        """Write ``kvembed.json`` into ``directory`` (default: :attr:`directory`) atomically: a reader
        never sees half of it. The exporter's one write of an artifact's manifest."""
        return write_text_atomic(Path(directory if directory is not None else self.artifact_directory()) / MANIFEST, _text(self.to_dict()))

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    @property
    def method_names(self) -> list[str]:
        """The main method's name, then each ``--also`` label: what the artifact can embed with."""
        return [self.method.name, *self.also]

    def output(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.outputs if spec.name == name), None)

    @property
    def graph_precision(self) -> str:
        """The precision of ``model.onnx`` itself: a bf16 artifact holds the fp32 graph (bf16 is how
        a certified backend runs it), every other precision is its graph's."""
        return "fp32" if self.precision == "bf16" else self.precision

    def graph_file(self, backend: str) -> str:
        """The graph file ``backend`` runs: its own where the exporter wrote one (the manifest's
        ``graphs``: an int8 artifact's OpenVINO graph), else ``model.onnx``. The one lookup: the
        runtime's sessions and the exporter's gates both ask here."""
        return self.graphs.get(backend, MODEL)

    def graph_path(self, backend: str) -> Path:
        """:meth:`graph_file` in the directory the manifest was read from."""
        return self.artifact_directory() / self.graph_file(backend)

    def artifact_directory(self) -> Path:
        """The artifact directory (:attr:`directory`); an error for a manifest built in code."""
        if self.directory is None:
            raise InvalidInput("this manifest was not read from an artifact directory: load it with load_manifest, "
                               "or name the directory")
        return self.directory

    def certificate(self, backend: str, precision: str, bar: str | None = None) -> Certificate | None:
        """The best certificate saying ``backend`` computing at ``precision`` met the bar of ``bar``
        (default: ``precision``'s; an int8 artifact run in bf16 answers to int8's) against PyTorch, or None."""
        found = [c for c in self.certified if c.certifies(backend, precision, bar)]
        return max(found, key=lambda c: c.worst_cosine) if found else None

    @property
    def passed(self) -> bool:
        """Whether the export's parity gate passed."""
        return self.parity is not None and self.parity.passed


KNOWN_KEYS = frozenset({*REQUIRED_KEYS, *DEFAULTS})


def _read_json(directory: str | os.PathLike[str]) -> tuple[Path, Any, bytes]:
    directory = Path(directory)
    made_by = f"an artifact directory holds {ARTIFACT_FILES}"
    if not directory.is_dir():
        raise FileNotFoundError(f"no artifact directory at {str(directory)!r}; {made_by}")
    path = directory / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{str(directory)!r} is not a kvembed artifact: it has no {MANIFEST}; {made_by}")
    raw = path.read_bytes()
    try:
        return path, json.loads(raw.decode("utf-8")), raw
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InvalidInput(f"{path} is not valid JSON: {err}") from None


def load_manifest(directory: str | os.PathLike[str]) -> Manifest:
    """The typed manifest of an artifact directory, which remembers the directory; FileNotFoundError
    / ValueError say what is wrong. Read it once per load and hand the :class:`Manifest` on."""
    return load_manifest_and_bytes(directory)[0]


def load_manifest_and_bytes(directory: str | os.PathLike[str]) -> tuple[Manifest, bytes]:
    """:func:`load_manifest`, and the bytes of ``kvembed.json`` it was parsed from (one read), for a
    caller that hashes the file as well (a corpus run's identity)."""
    path, data, raw = _read_json(directory)
    return _finished(Manifest.from_dict(data, str(path), directory=directory), path), raw


def _finished(manifest: Manifest, path: Path) -> Manifest:
    """``manifest`` if its export's gate ran: an artifact on disk without a report was never exported whole."""
    if manifest.parity is None:
        raise InvalidInput(f"{path}: parity is empty: no parity gate ran on this artifact (kvembed-export writes one); re-export it")
    return manifest


def manifest_of(source: Manifest | str | os.PathLike[str]) -> Manifest:
    """``source`` as it is when it is a :class:`Manifest`, else the manifest of that directory."""
    return source if isinstance(source, Manifest) else load_manifest(source)


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest's JSON as a dict of its own, checked as :func:`load_manifest` checks it (the
    public API of ``kvembed.runtime`` and ``kvembed.export``; new code reads the typed manifest)."""
    path, data, _ = _read_json(directory)
    _finished(Manifest.from_dict(data, str(path)), path)
    return data


def _text(data: Mapping[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def write_manifest(directory: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Write ``kvembed.json`` into ``directory`` atomically (:meth:`Manifest.write`)."""
    return manifest.write(directory)


def record_certificates(directory: str | os.PathLike[str] | Manifest, certificates: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Add ``certificates`` to the artifact's ``certified`` list (:func:`~.certificates.merged`) and
    write ``kvembed.json`` back atomically; returns the manifest written. The manifest is not among
    the hashed files (:mod:`.files`), so the artifact still verifies."""
    from .certificates import merged

    manifest = manifest_of(directory)
    changed = manifest.updated(certified=merged([c.to_dict() for c in manifest.certified], certificates))
    changed.write()
    return changed.to_dict()
