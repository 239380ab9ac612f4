"""The headline results are data: every record in benchmarks/results/headline/ names its CPU, date,
versions and source and gives figures with units, and README.md and docs/benchmarks.md hold
exactly what benchmarks/render_results.py renders from them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
HEADLINE = BENCHMARKS / "results" / "headline"
sys.path.insert(0, str(BENCHMARKS))

import record  # noqa: E402
import render_results  # noqa: E402

RECORDS = sorted(HEADLINE.glob("*.json"))


def test_there_are_headline_records() -> None:
    assert len(RECORDS) >= 6, RECORDS


@pytest.mark.parametrize("path", RECORDS, ids=[p.name for p in RECORDS])
def test_a_headline_record_has_every_field(path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert render_results.headline_problems(data) == []
    assert data["cpu"]["model"] and set(record.FLAGS) | {"amx"} <= set(data["cpu"]["flags"])
    assert all(fig["unit"] for fig in data["figures"].values())
    # a source is a file under benchmarks/ (a raw file or a log page) that exists
    first = data["source"].split(",")[0].split(" ")[0]
    assert (ROOT / first).exists(), first


def test_the_pages_equal_the_rendering() -> None:
    run = subprocess.run([sys.executable, str(BENCHMARKS / "render_results.py"), "--check"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr


def test_a_record_written_here_has_every_field(tmp_path: Path) -> None:
    path = record.write_record("smoke", {"ratio": record.figure(1.5, "x")}, command="python smoke.py", directory=tmp_path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert record.problems(data) == []
    assert data["command"] == "python smoke.py" and data["versions"]["python"]
    assert data["date"].endswith("+00:00")


def test_a_figure_without_a_unit_is_refused() -> None:
    with pytest.raises(ValueError, match="unit"):
        record.record("smoke", {"ratio": {"value": 1.5, "unit": ""}}, command="x")


def test_check_fails_on_stale_pages_and_rendering_mends_them(tmp_path: Path) -> None:
    readme, docs = tmp_path / "README.md", tmp_path / "benchmarks.md"
    readme.write_text("# x\n\n<!-- results:start -->\nold\n<!-- results:end -->\n\nkept\n", encoding="utf-8")
    docs.write_text("# Benchmarks\n", encoding="utf-8")
    paths = ["--readme", str(readme), "--docs", str(docs), "--charts", str(tmp_path / "charts")]
    assert render_results.main(["--check", *paths]) == 1
    assert docs.read_text(encoding="utf-8") == "# Benchmarks\n"
    assert render_results.main(paths) == 0
    assert render_results.main(["--check", *paths]) == 0
    text = readme.read_text(encoding="utf-8")
    assert "old" not in text and text.startswith("# x\n") and text.endswith("\n\nkept\n")
    assert "| figure | value | CPU |" in text and "docs/assets/charts/peers.svg" in text
    assert (tmp_path / "charts" / "peers.svg").read_text(encoding="utf-8").startswith("<svg ")
