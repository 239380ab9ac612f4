"""Render the headline results table from ``benchmarks/results/headline/*.json`` into README.md
(between ``<!-- results:start -->`` and ``<!-- results:end -->``) and into ``docs/benchmarks.md``.

Why one renderer: the figures a reader relies on must come from one place, each with the CPU and
the date it was measured on, and never drift from the records (``--check``, run by
tests/test_results.py, fails when either page differs from what the records render to).

    python benchmarks/render_results.py           # rewrite both pages
    python benchmarks/render_results.py --check   # exit 1 if either page is stale

A headline record is a :mod:`record` record plus ``source`` (the raw file or log page its figures
come from), ``log`` (``page`` and ``section`` of the lab notes in ``benchmarks/log/``) and
``rows``: each a ``figure`` label and a ``value`` template naming figures, ``"{ratio} ({a} vs {b})"``.
A row with ``readme`` (its own short ``figure`` and ``value``) is also one of README's at most
:data:`README_ROWS` rows; ``charts`` entries put figures on the charts (:mod:`charts`), written as
SVG to ``docs/assets/charts/``. Records render in file-name order.

The docs site publishes the lab notes as pages under ``lab/`` (``docs/hooks/lab_notes.py``), so the
Benchmarks page links them there, with the anchors the site gives their headings; README links
the Benchmarks page and the notes as the repository holds them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

sys.path.insert(0, str(Path(__file__).resolve().parent))
from charts import entry_problems, render_charts  # noqa: E402
from record import problems  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HEADLINE = ROOT / "benchmarks" / "results" / "headline"
LOG = ROOT / "benchmarks" / "log"
README = ROOT / "README.md"
DOCS = ROOT / "docs" / "benchmarks.md"
CHARTS = ROOT / "docs" / "assets" / "charts"
#: README's table: at most this many rows, each line at most this many characters
README_ROWS, README_WIDTH = 8, 120
START, END = "<!-- results:start -->", "<!-- results:end -->"
#: headline fields beyond a run record's
HEADLINE_FIELDS = ("source", "log", "rows")
#: units written straight after the number (4.67x); scores are written bare (0.9999)
SUFFIX_UNITS = {"x", "%"}
BARE_UNITS = {"cosine", "spearman"}
PLACEHOLDER = re.compile(r"\{(\w+)\}")


def load(directory: Path = HEADLINE) -> list[tuple[Path, dict[str, Any]]]:
    """Every headline record, in file-name order."""
    return [(path, json.loads(path.read_text(encoding="utf-8"))) for path in sorted(directory.glob("*.json"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading, which the docs site gives too (mkdocs.yml: pymdownx.slugs'
    lowercase slugify) except for a repeated heading's suffix (:func:`anchor`)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchor(page: Path, section: str, site: bool = False) -> str:
    """The anchor of ``section`` on ``page``, with GitHub's ``-1``, ``-2`` for repeated headings
    (``site``: the docs site's ``_1``, ``_2``, as Python-Markdown's toc numbers them)."""
    seen: dict[str, int] = {}
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip()
            base = slug(text)
            count = seen.get(base, 0)
            seen[base] = count + 1
            if text == section:
                return base if count == 0 else f"{base}{'_' if site else '-'}{count}"
    raise LookupError(f"no heading {section!r} in {page}")


def headline_problems(data: Mapping[str, Any]) -> list[str]:
    """What a headline record lacks, beyond :func:`record.problems`: its source, its log section,
    rows whose templates name figures it has, versions or a note saying why there are none."""
    found = problems(data) + [f"no {key}" for key in HEADLINE_FIELDS if not data.get(key)]
    if not data.get("versions") and not data.get("versions_note"):
        found.append("no versions and no versions_note")
    log = data.get("log") or {}
    page = ROOT / str(log.get("page", ""))
    if not page.is_file() or LOG not in page.parents:
        found.append(f"log page {log.get('page')!r} is not in benchmarks/log/")
    else:
        try:
            anchor(page, str(log.get("section")))
        except LookupError as error:
            found.append(str(error))
    for row in data.get("rows") or []:
        for form in [row, *([row["readme"]] if "readme" in row else [])]:
            if not form.get("figure") or not form.get("value"):
                found.append(f"row {row!r} needs a figure label and a value")
            missing = set(PLACEHOLDER.findall(form.get("value", ""))) - set(data.get("figures") or {})
            found += [f"row names unknown figure {name!r}" for name in sorted(missing)]
    for entry in data.get("charts") or []:
        found += entry_problems(entry, data.get("figures") or {})
    return found


def number(value: float | int) -> str:
    """A figure's number as the logs write it: thousands separated, the given decimals kept."""
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 100:
        return f"{int(value):,}"
    return str(value)


def show(fig: Mapping[str, Any]) -> str:
    """One figure with its unit: ``4.67x``, ``16.05 GiB``, ``0.999944``."""
    unit = fig["unit"]
    if unit in SUFFIX_UNITS:
        return number(fig["value"]) + unit
    if unit in BARE_UNITS:
        return number(fig["value"])
    return f"{number(fig['value'])} {unit}"


def cpu_name(data: Mapping[str, Any]) -> str:
    cpu = data["cpu"]
    return cpu.get("label") or f"{cpu['model']}, {data.get('cores')} cores"


def cpu_short(data: Mapping[str, Any]) -> str:
    """The CPU in a few words for README: its name before the details, and whether it has AMX."""
    name = cpu_name(data).split(" (")[0].split(",")[0]
    return name + (" (AMX)" if data["cpu"].get("flags", {}).get("amx") else "")


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def value_of(template: str, figures: Mapping[str, Any]) -> str:
    return PLACEHOLDER.sub(lambda m: show(figures[m.group(1)]), template)


def table(records: list[tuple[Path, dict[str, Any]]], link: Callable[[str, str], str]) -> str:
    """The headline table; ``link(page, section)`` is the URL of a log section on the page rendered."""
    lines = ["| figure | value | CPU | date | log |", "|---|---|---|---|---|"]
    for _, data in records:
        page = ROOT / data["log"]["page"]
        target = link(data["log"]["page"], data["log"]["section"])
        figures = data["figures"]
        for row in data["rows"]:
            lines.append(f"| {cell(row['figure'])} | {cell(value_of(row['value'], figures))} | {cell(cpu_name(data))} | "
                         f"{data['date'][:10]} | [{page.stem}]({target}) |")
    return "\n".join(lines) + "\n"


def readme_table(records: list[tuple[Path, dict[str, Any]]]) -> str:
    """README's short table: the rows marked ``readme``, in their short words."""
    lines = ["| figure | value | CPU |", "|---|---|---|"]
    for _, data in records:
        for row in data["rows"]:
            if "readme" in row:
                short = row["readme"]
                lines.append(f"| {cell(short['figure'])} | {cell(value_of(short['value'], data['figures']))} | {cell(cpu_short(data))} |")
    if len(lines) - 2 > README_ROWS:
        raise SystemExit(f"README's table would have {len(lines) - 2} rows, over {README_ROWS}: mark fewer rows readme")
    wide = [line for line in lines if len(line) > README_WIDTH]
    if wide:
        raise SystemExit(f"README's table has lines over {README_WIDTH} characters: {wide[0]!r}")
    return "\n".join(lines) + "\n"


def readme(current: str, records: list[tuple[Path, dict[str, Any]]], charts: Mapping[str, str]) -> str:
    """README.md with the short table and the charts between the markers (the rest untouched)."""
    if current.count(START) != 1 or current.count(END) != 1 or current.index(START) > current.index(END):
        raise SystemExit(f"README.md needs one {START} ... {END} pair")
    head, rest = current.split(START)
    _, tail = rest.split(END)
    pictures = "".join(f"![{CHART_TITLES[name]}](docs/assets/charts/{name})\n" for name in charts)
    body = ("Headline figures: speed ratios measured interleaved; served rows at 16 x 128 / 1 x 32 / many clients;\n"
            "cos: the worst cosine to fp32. Every figure's date, exact configuration and lab notes:\n"
            "[docs/benchmarks.md](docs/benchmarks.md).\n\n"
            + readme_table(records) + "\n" + pictures)
    return f"{head}{START}\n{body}{END}{tail}"


#: alt text of each chart
CHART_TITLES = {"peers.svg": "kvembed against its peers, per workload", "fidelity.svg": "Speed against fidelity, per precision"}


def log_pages() -> list[tuple[str, str]]:
    """(file, title) of every log page, in the order of its index."""
    index = (LOG / "README.md").read_text(encoding="utf-8")
    return re.findall(r"^## \[(.+)\]\((.+\.md)\)$", index, flags=re.MULTILINE)


def docs_page(records: list[tuple[Path, dict[str, Any]]], charts: Mapping[str, str]) -> str:
    """docs/benchmarks.md: every row, the charts, and links to the lab notes as the site publishes
    them (``lab/PAGE.md``, docs/hooks/lab_notes.py), with the site's anchors."""
    link = lambda page, section: f"lab/{Path(page).name}#{anchor(ROOT / page, section, site=True)}"  # noqa: E731
    pages = "\n".join(f"- [{title}](lab/{name})" for title, name in log_pages())
    pictures = "\n".join(f"![{CHART_TITLES[name]}](assets/charts/{name})" for name in charts)
    return f"""# Benchmarks

<!-- Rendered by `python benchmarks/render_results.py` from benchmarks/results/headline/*.json: edit those. -->

The figures that are current, each with the CPU and the date it was measured on. Each row comes
from one JSON record in `benchmarks/results/headline/` that also holds the command, the versions
and the raw file or log page it was transcribed from.

{pictures}

sentence-transformers has no bar: its ONNX and OpenVINO backends gave no faithful embedder of
these decoder models ([peers](lab/peers.md)), so there is no speed of theirs to compare at equal
vectors.

{table(records, link)}
## How the figures are measured

The machines are 2-core VMs whose speed drifts by 10-30% from one minute to the next, so a speed
figure is a **ratio measured interleaved**: the calls compared run in the same process, in turns,
round after round, and the figure is the median of the per-round ratios (the absolute times
beside it are of that run). Peak memory is a fresh process's maximum resident set (`/usr/bin/time
-v`, `VmHWM`), one process per configuration. Fidelity is the worst row's cosine against the
PyTorch fp32 reference. **Every number names its CPU** because the CPU decides the result: bf16
runs fast only where the CPU has BF16 (AVX-512 BF16 or AMX), int8 gains most with VNNI or AMX,
and an fp16 artifact needs FP16 or BF16 to load at its own size. The quality row is a 115-pair
set written for this project: a check of the harness, not a benchmark.

To measure again, run the harness the row's log section names (`benchmarks/README.md` lists them);
each writes a record of its run to `benchmarks/results/records/`. A figure that supersedes a
headline one goes into its file in `benchmarks/results/headline/`, with its CPU, date, versions
and source, and `python benchmarks/render_results.py` renders this page and the README's table.

## The log

The dated lab notes behind these figures, with every run's machine, command and what was changed
because of it ([index](lab/README.md)):

{pages}
"""


def render(readme_path: Path = README, docs_path: Path = DOCS, charts_dir: Path = CHARTS) -> dict[Path, str]:
    """What the README, the Benchmarks page and the charts should hold (the README's text outside
    the markers kept)."""
    records = load()
    bad = {path.name: found for path, data in records if (found := headline_problems(data))}
    if bad:
        raise SystemExit("headline records with problems:\n" + "\n".join(f"  {name}: {'; '.join(p)}" for name, p in bad.items()))
    charts = render_charts(records)
    return {readme_path: readme(readme_path.read_text(encoding="utf-8"), records, charts), docs_path: docs_page(records, charts),
            **{charts_dir / name: svg for name, svg in charts.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md or docs/benchmarks.md differ from the rendering")
    parser.add_argument("--readme", type=Path, default=README, help="the README to render into (default: the repository's)")
    parser.add_argument("--docs", type=Path, default=DOCS, help="the Benchmarks page to write (default: docs/benchmarks.md)")
    parser.add_argument("--charts", type=Path, default=CHARTS, help="the charts' folder (default: docs/assets/charts)")
    args = parser.parse_args(argv)
    stale = []
    for path, text in render(args.readme, args.docs, args.charts).items():
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        if args.check:
            stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print("stale (run python benchmarks/render_results.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
