"""The artifact contract: what an exported artifact directory holds (:mod:`.layout`), its typed
manifest (:mod:`.manifest`, read once per load and handed to every reader) with the export's typed
report (:mod:`.report`), its file hashes and
the one integrity check (:mod:`.files`: :func:`check_intact`), the signature of the whole folder
that a loader given a trust key checks (:mod:`.signing`: :func:`verify_signature`) and the one
staged writer that writes a directory whole or not at all (:mod:`.staging`).

Torch-free and light (the standard library and :mod:`kvembed.methods`): the exporter writes
through it, every loader reads through it.
"""

from .certificates import TOLERANCES, Certificate, certificates_of, merged
from .files import DamagedArtifact, check_files, check_intact, check_records, closed_problems, file_records, record_of, sha256_file
from .layout import ARTIFACT_FILES, ENCODER_TOKENIZER, MANIFEST, MODEL, MODEL_DATA, OPENVINO_MODEL, SIGNATURE, TOKENIZER, is_artifact
from .manifest import (
    REQUIRED_KEYS, SCHEMA_VERSION, ContextEncoder, FileRecord, GraphFacts, Manifest, Source, TensorSpec, load_manifest,
    load_manifest_and_bytes, manifest_of, read_manifest, record_certificates, write_manifest,
)
from .options import check_artifact_options
from .report import Advisory, ExportReport, HeldOut, ParityReport
from .signing import TRUST_KEY_ENV, UntrustedArtifact, sign_artifact, trust_key_path, verify_signature
from .staging import OutputExistsError, OutputIsAFileError, check_output, staged, write_text_atomic

__all__ = [
    "ARTIFACT_FILES", "SIGNATURE", "TRUST_KEY_ENV", "UntrustedArtifact", "sign_artifact", "trust_key_path", "verify_signature", "Certificate", "TOLERANCES", "certificates_of", "merged", "ENCODER_TOKENIZER", "MANIFEST", "MODEL", "MODEL_DATA", "OPENVINO_MODEL", "REQUIRED_KEYS", "SCHEMA_VERSION", "TOKENIZER",
    "Advisory", "ContextEncoder", "DamagedArtifact", "ExportReport", "ParityReport", "FileRecord", "GraphFacts", "HeldOut", "Manifest", "OutputExistsError", "OutputIsAFileError", "Source",
    "TensorSpec", "check_artifact_options", "check_files", "check_intact", "closed_problems", "check_output", "check_records", "file_records", "is_artifact", "load_manifest",
    "load_manifest_and_bytes", "manifest_of", "read_manifest", "record_certificates", "record_of", "sha256_file", "staged", "write_manifest", "write_text_atomic",
]
