"""``kvembed embed``: the command line a person uses to try methods."""

from __future__ import annotations

import numpy as np
from typer.testing import CliRunner

from kvembed.cli import app
from kvembed.reference import TorchEmbedder

runner = CliRunner()


def test_embed_prints_a_table_and_similarity():
    result = runner.invoke(app, ["embed", "--similarity", "A cat sat.", "A dog ran."])
    assert result.exit_code == 0, result.output
    assert "kv-embedding on stories260k: 2 x 64" in result.output
    assert "cosine similarity" in result.output and "1.0000" in result.output


def test_embed_writes_npy_equal_to_the_api(tmp_path):
    out = tmp_path / "vectors.npy"
    args = ["embed", "--method", "token-prepending", "--tp-stop", "2", "--kind", "query", "-o", str(out), "one", "two"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    expected = TorchEmbedder.from_pretrained("stories260k", "token-prepending", tp_stop=2).encode_query(["one", "two"])
    np.testing.assert_allclose(np.load(out), expected, atol=1e-6)


def test_embed_user_errors_exit_2_without_traceback():
    result = runner.invoke(app, ["embed", "--method", "va", "--layers", "9", "x"])
    assert result.exit_code == 2
    assert "valid indices are 0..4" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["embed", "--method", "nope", "x"])
    assert result.exit_code == 2 and "available methods" in result.output
