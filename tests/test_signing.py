"""Signed artifacts: ``kvembed sign`` signs the whole artifact folder with OpenSSF model-signing and
an EC P-256 key; a loader given the public key (``--trust-key``, ``KVEMBED_TRUST_KEY``,
``Embedder.load(trust_key=)``) refuses a tampered file or manifest even when the manifest's hashes
were rewritten to match, an unsigned artifact, and another key's signature, each in one line.

Real components only: keys made with ``cryptography``, the demo model's exported artifact, the real
``kvembed`` program as a subprocess, model-signing's own signature file read back independently.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

pytest.importorskip("model_signing", reason="the sign extra: pip install 'kvembed[sign]'")

from cryptography.hazmat.primitives import serialization  # noqa: E402  (model-signing brings it)
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

from kvembed.artifact import MANIFEST, MODEL, SIGNATURE, UntrustedArtifact, sign_artifact  # noqa: E402
from kvembed.cli.main import app  # noqa: E402
from kvembed.runtime import Embedder  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

KVEMBED = str(Path(sys.executable).with_name("kvembed"))
TEXTS = ["a cat sat on the mat", "the dog ran home"]
runner = CliRunner()


def kvembed(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed program, output piped; never a traceback."""
    done = subprocess.run([KVEMBED, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200", "KVEMBED_STATUS_AFTER": "inf", **(env or {})})
    assert "Traceback" not in done.stderr, done.stderr
    return done


def refused(done: subprocess.CompletedProcess[str] | object, *words: str) -> str:
    """The one error line of a refused command (exit 2), holding each of ``words``."""
    code = getattr(done, "returncode", getattr(done, "exit_code", None))
    stderr = getattr(done, "stderr", None) if hasattr(done, "returncode") else getattr(done, "output", "")
    lines = [line for line in (stderr or "").splitlines() if line.strip()]
    assert code == 2, (code, stderr)
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, stderr
    for word in words:
        assert word in errors[0], (word, errors[0])
    return errors[0]


def key_pair(folder: Path, name: str) -> tuple[Path, Path]:
    """A real EC P-256 key pair as PEM files (what openssl ecparam -name prime256v1 writes)."""
    private = ec.generate_private_key(ec.SECP256R1())
    key, pub = folder / f"{name}.pem", folder / f"{name}.pub.pem"
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                          serialization.NoEncryption()))
    pub.write_bytes(private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return key, pub


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("keys")
    key, pub = key_pair(folder, "signer")
    _, other = key_pair(folder, "other")
    return {"key": key, "pub": pub, "other": other}


@pytest.fixture(scope="module")
def unsigned(stories_artifact) -> Path:
    """The shared demo artifact: read-only here (never signed, never damaged)."""
    return stories_artifact("kv-embedding")


@pytest.fixture(scope="module")
def signed(unsigned, keys, tmp_path_factory) -> Path:
    """A copy of the demo artifact, signed by the real ``kvembed sign``."""
    folder = tmp_path_factory.mktemp("signed") / "kv"
    shutil.copytree(unsigned, folder)
    done = kvembed("sign", str(folder), "--private-key", str(keys["key"]))
    assert done.returncode == 0, done.stderr
    assert str(folder / SIGNATURE) in done.stdout
    return folder


def copy_of(signed: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "copy"
    shutil.copytree(signed, folder)
    return folder


def rewrite_manifest(folder: Path, change=None) -> None:
    """Change the manifest (``change(manifest)``) and write every file's sha256 and size in it as
    they now are: what someone who rewrites a weight does to get past the hashes."""
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    if change is not None:
        change(manifest)
    for name in manifest["files"]:
        data = (folder / name).read_bytes()
        manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def tamper_weight(folder: Path) -> None:
    """Scale the largest weight of the graph (a valid graph still: it loads and embeds, differently)."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(folder / MODEL))
    tensor = max(graph.graph.initializer, key=lambda t: np.prod(t.dims))
    tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor) * 1.5, tensor.name))
    onnx.save(graph, str(folder / MODEL))


# -- signing -----------------------------------------------------------------------------------


def test_the_signature_covers_every_file_but_itself(signed, keys):
    """Read back independently: model-signing's bundle holds a DSSE envelope whose in-toto statement
    names every file of the folder, the manifest included, by sha256, and not the signature."""
    bundle = json.loads((signed / SIGNATURE).read_text(encoding="utf-8"))
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    assert statement["predicate"]["serialization"]["ignore_paths"] == [SIGNATURE]
    assert {r["algorithm"] for r in statement["predicate"]["resources"]} == {"sha256"}
    subjects = {r["name"]: r["digest"] for r in statement["predicate"]["resources"]}
    on_disk = {p.name for p in signed.iterdir() if p.name != SIGNATURE}
    assert set(subjects) == on_disk and MANIFEST in subjects and SIGNATURE not in subjects
    for name, digest in subjects.items():
        assert digest == hashlib.sha256((signed / name).read_bytes()).hexdigest(), name
    hint = bundle["verificationMaterial"]["publicKey"]["hint"]  # the signer's key, named by its public key's hash
    assert hint == hashlib.sha256(keys["pub"].read_bytes()).hexdigest()


def test_sign_then_embed_with_the_trust_key_gives_the_same_vectors(signed, keys, tmp_path):
    trusted = kvembed("embed", str(signed), *TEXTS, "--trust-key", str(keys["pub"]), "--output", str(tmp_path / "t.npy"))
    assert trusted.returncode == 0, trusted.stderr
    plain = Embedder.load(signed).encode(TEXTS)
    np.testing.assert_array_equal(np.load(tmp_path / "t.npy"), plain)
    loaded = Embedder.load(signed, trust_key=keys["pub"])  # the API: the same check, the same vectors
    np.testing.assert_array_equal(loaded.encode(TEXTS), plain)


def test_a_rewritten_weight_with_its_manifest_hash_is_refused_only_under_the_trust_key(signed, keys, tmp_path):
    folder = copy_of(signed, tmp_path)
    tamper_weight(folder)
    rewrite_manifest(folder)
    accepted = Embedder.load(folder)  # the hashes alone are fooled: it loads, and embeds differently
    assert not np.allclose(accepted.encode(TEXTS), Embedder.load(signed).encode(TEXTS), atol=1e-4)
    done = kvembed("embed", str(folder), "hello", "--trust-key", str(keys["pub"]))
    refused(done, str(folder), "not trusted", f"{MODEL} changed", f"{MANIFEST} changed")
    with pytest.raises(UntrustedArtifact, match=f"{MODEL} changed"):
        Embedder.load(folder, trust_key=keys["pub"])


def test_a_rewritten_manifest_alone_is_refused(signed, keys, tmp_path):
    folder = copy_of(signed, tmp_path)
    rewrite_manifest(folder, lambda manifest: manifest.update(max_length=8))  # every input cut at 8 tokens
    assert Embedder.load(folder).max_length == 8  # accepted without a key
    with pytest.raises(UntrustedArtifact, match=f"not trusted by {keys['pub'].name}: its files differ from what was signed: {MANIFEST} changed$"):
        Embedder.load(folder, trust_key=keys["pub"])


def test_a_file_added_after_signing_is_refused(signed, keys, tmp_path):
    folder = copy_of(signed, tmp_path)
    (folder / "extra.onnx").write_bytes(b"not signed")
    with pytest.raises(UntrustedArtifact, match="not signed: extra.onnx"):
        Embedder.load(folder, trust_key=keys["pub"])


def test_a_link_to_the_folder_is_followed_and_a_link_inside_is_refused(signed, keys, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(signed, target_is_directory=True)
    Embedder.load(link, trust_key=keys["pub"])
    folder = copy_of(signed, tmp_path)
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to(folder / MODEL)  # inside the folder: the hashes alone allow it
    with pytest.raises(UntrustedArtifact, match="tokenizer.json is a symbolic link"):
        Embedder.load(folder, trust_key=keys["pub"])


def test_an_unsigned_artifact_is_refused(unsigned, keys):
    with pytest.raises(UntrustedArtifact, match=f"{SIGNATURE} is missing"):
        Embedder.load(unsigned, trust_key=keys["pub"])


def test_another_keys_signature_is_refused(signed, keys):
    with pytest.raises(UntrustedArtifact, match="signed by another key"):
        Embedder.load(signed, trust_key=keys["other"])


def test_the_trust_key_from_the_environment(signed, keys):
    done = kvembed("embed", str(signed), "hello", env={"KVEMBED_TRUST_KEY": str(keys["other"])})
    refused(done, str(signed), "signed by another key")
    served = kvembed("serve", str(signed), "--port", "0", env={"KVEMBED_TRUST_KEY": str(keys["other"])})  # before the bind
    refused(served, "model 'kv'", str(signed), "signed by another key")
    # empty: no key (as kvembed.env's KVEMBED_TRUST_KEY= leaves it)
    assert runner.invoke(app, ["embed", str(signed), "hello"], env={"KVEMBED_TRUST_KEY": ""}).exit_code == 0


def test_every_loading_command_takes_the_trust_key(unsigned, keys, tmp_path):
    """verify, eval, embed-corpus and serve refuse the unsigned artifact before their slow parts."""
    texts = tmp_path / "docs.txt"
    texts.write_text("one\ntwo\n", encoding="utf-8")
    key = ["--trust-key", str(keys["pub"])]
    for args in (["verify", str(unsigned), *key], ["eval", str(unsigned), "--task", "sample", "--out", str(tmp_path / "e"), *key],
                 ["embed-corpus", str(unsigned), "-i", str(texts), "-o", str(tmp_path / "c"), *key],
                 ["embed", "--model", "stories260k", "hello", *key]):
        result = runner.invoke(app, args)
        refused(result, "signed")
    from kvembed.serve.config import ServeConfig
    from kvembed.serve.preflight import check_artifacts

    with pytest.raises(UntrustedArtifact, match=f"model 'kv': artifact '{unsigned}' is not trusted"):
        check_artifacts(ServeConfig(artifacts=(("kv", unsigned),), trust_key=keys["pub"]))
    assert ServeConfig(artifacts=(("kv", unsigned),), trust_key="").trust_key is None


# -- bad keys, a damaged artifact, a missing package: one line, exit 2 ---------------------------


def test_sign_with_a_missing_or_non_pem_key_is_one_line(unsigned, keys, tmp_path):
    folder = tmp_path / "kv"
    shutil.copytree(unsigned, folder)
    refused(kvembed("sign", str(folder), "--private-key", str(tmp_path / "absent.pem")), "absent.pem", "does not exist")
    (tmp_path / "junk.pem").write_text("not a key\n", encoding="utf-8")
    refused(kvembed("sign", str(folder), "--private-key", str(tmp_path / "junk.pem")), "junk.pem", "not a PEM private key")
    refused(runner.invoke(app, ["sign", str(folder), "--private-key", str(keys["pub"])]), "holds a public key")
    refused(runner.invoke(app, ["embed", str(folder), "x", "--trust-key", str(keys["key"])]), "holds a private key")
    assert not (folder / SIGNATURE).exists()


def test_a_damaged_artifact_is_never_signed(unsigned, keys, tmp_path):
    folder = tmp_path / "kv"
    shutil.copytree(unsigned, folder)
    (folder / "tokenizer.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ValueError, match="is damaged"):
        sign_artifact(folder, keys["key"])
    assert not (folder / SIGNATURE).exists()


def test_the_runtime_stays_light_and_a_missing_package_is_named(signed, keys):
    """Without a key model-signing is never imported; with one, and without the package, one line
    says which extra to install (the package hidden from this child process only)."""
    code = f"""
import sys
from kvembed.runtime import Embedder
Embedder.load({str(signed)!r}).encode(["x"])
assert "model_signing" not in sys.modules, "model_signing imported without a trust key"
sys.modules["model_signing"] = None  # as if not installed
from kvembed.cli.main import main
sys.argv = ["kvembed", "embed", {str(signed)!r}, "x", "--trust-key", {str(keys['pub'])!r}]
main()
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KVEMBED_STATUS_AFTER": "inf"})
    refused(done, "needs model-signing", "pip install 'kvembed[sign]'")


# -- bundles carry the signature ----------------------------------------------------------------


def test_a_bundle_carries_the_signature_and_checks_it(signed, unsigned, keys, tmp_path):
    from kvembed.artifact import load_manifest
    from kvembed.bundle.artifacts import add_artifact
    from kvembed.bundle.render import template_values, write_templates

    record = add_artifact(signed, tmp_path / "artifacts" / "kv", load_manifest(signed))
    assert record["signed"] and SIGNATURE in record["files"]
    Embedder.load(tmp_path / "artifacts" / "kv", trust_key=keys["pub"])  # the bundled copy verifies
    refused(runner.invoke(app, ["bundle", str(unsigned), "--out", str(tmp_path / "b"), "--trust-key", str(keys["pub"])]),
            "not signed")  # refused before any download
    assert not (tmp_path / "b").exists()
    values = template_values(models=["kv"], target_platform="linux-x86_64", machine="x86_64", python="3.11", target="t",
                             prefix="/opt/kvembed", bundle_name="b", kvembed_version="0", extras=["serve", "sign"],
                             wheel_count=1, wheelhouse_bytes=1, signed=True)
    write_templates(tmp_path, values)
    install = (tmp_path / "install.sh").read_text(encoding="utf-8")
    assert "SIGNED=yes" in install and '--trust-key "$KEY"' in install
    shellcheck = shutil.which("shellcheck", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if shellcheck:
        done = subprocess.run([shellcheck, str(tmp_path / "install.sh")], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout
