"""The families table README and the docs print is the architecture table's own, and what it says
proves a family is what the tests prove it with."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from kvembed.methods.architectures import SUPPORTED
from kvembed.methods.families import CHECKED, NAMES, TRAINED_FAMILY
from kvembed.methods.models import TRAINED_EMBEDDERS

ROOT = Path(__file__).resolve().parents[1]


def _hook():
    spec = importlib.util.spec_from_file_location("families_hook", ROOT / "docs" / "hooks" / "families.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_s_table_is_the_architecture_table_s():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert _hook().readme_with_tables(text) == text, "README's families tables are stale: run python docs/hooks/families.py"
    for arch in SUPPORTED:
        assert f"| `{arch}` |" in text


def test_the_docs_page_takes_the_table_from_the_hook():
    page = (ROOT / "docs" / "reference" / "models.md").read_text(encoding="utf-8")
    assert _hook().MARKER in page
    rendered = _hook().on_page_markdown(page, None, None, None)
    assert all(f"`{arch}`" in rendered for arch in SUPPORTED) and all(f"`{alias}`" in rendered for alias in TRAINED_EMBEDDERS)


def test_every_family_and_trained_embedder_is_named():
    assert set(NAMES) == set(SUPPORTED)
    assert set(CHECKED) <= set(SUPPORTED)
    assert set(TRAINED_FAMILY) == set(TRAINED_EMBEDDERS) and set(TRAINED_FAMILY.values()) <= set(SUPPORTED)


def test_the_sentence_transformers_claims_are_the_folders_the_tests_export():
    from test_sentence_transformers_folders import FOLDERS

    claimed = {arch for arch, proofs in CHECKED.items() if any("sentence-transformers" in proof for proof in proofs)}
    assert claimed == {arch for arch, _, _ in FOLDERS.values()}
