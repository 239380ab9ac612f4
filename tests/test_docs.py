"""The docs site: it builds with ``mkdocs build --strict``, its pages' commands follow the rule of
tests/doc_commands.py (each reads only what an earlier one wrote, no placeholders), the guides
speak as a product (no measured figures, machines, dates or issue numbers: those live on the
Benchmarks page), and the commands of every page that uses the demo model run as written.

The run: docs/getting-started.md's commands once, in a fresh folder (the demo export the guides
build on); then each guide's commands in a folder of its own that sees getting-started's files.
Commands marked ``# not run in tests: <why>`` and environment setup are skipped, and so are the
few another test runs as written on the same demo export (``RUN_ELSEWHERE``: each costs a
PyTorch load, and the suite's time is bounded). conftest.py puts
this file's tests in one pytest-xdist group, so the export is made once.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pytest

from doc_commands import DOCS, GETTING_STARTED, ROOT, Snippet, check_commands, commands, doc_pages, snippets
from test_architecture import FIGURE, ISSUE

GUIDES = sorted((DOCS / "guides").glob("*.md"))
#: pages whose prose is the product's: no figures, machines, dates or history
PRODUCT_PAGES = [DOCS / "index.md", GETTING_STARTED, DOCS / "architecture.md", *GUIDES, *sorted((DOCS / "reference").glob("*.md"))]
#: rules and defaults written with a unit, not measurements
RULES = {"256 MiB", "50 MB", "2MB"}
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
MACHINE = re.compile(r"\b(Zen \d|EPYC|Xeon|Sapphire Rapids|on a quiet|measured here)\b", re.IGNORECASE)


def page_id(page: Path) -> str:
    return str(page.relative_to(DOCS))


def test_the_guides_exist_and_are_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in [*PRODUCT_PAGES, DOCS / "methods.md", DOCS / "benchmarks.md"]:
        assert page.is_file(), page
        assert page_id(page) in nav, f"{page_id(page)} is not in mkdocs.yml's nav"


@pytest.mark.parametrize("page", doc_pages(), ids=page_id)
def test_every_command_reads_only_what_an_earlier_one_wrote(page: Path) -> None:
    """The rule of tests/doc_commands.py: a guide may also read what getting-started.md wrote."""
    _, started = check_commands(commands(GETTING_STARTED.read_text(encoding="utf-8")))
    seed = set() if page == GETTING_STARTED else started
    problems, _ = check_commands(commands(page.read_text(encoding="utf-8")), seed, where=f"{page_id(page)}: ")
    assert not problems, "\n".join(problems)


def test_the_check_refuses_what_only_another_guide_wrote() -> None:
    """A guide cannot lean on another guide's files: only getting-started.md's count."""
    export = commands((DOCS / "guides" / "export.md").read_text(encoding="utf-8"))
    _, written = check_commands(export)
    assert "artifacts/va-int8" in written
    problems, _ = check_commands(["kvembed serve artifacts/va-int8"], {"artifacts/stories260k-kv"})
    assert problems and "va-int8" in problems[0]


@pytest.mark.parametrize("page", PRODUCT_PAGES, ids=page_id)
def test_pages_carry_no_figures_dates_machines_or_issue_numbers(page: Path) -> None:
    text = re.sub(r"`[^`\n]*`", "", page.read_text(encoding="utf-8"))  # option values and defaults in code
    found = [m.group(0) for pattern in (FIGURE, ISSUE, DATE, MACHINE) for m in pattern.finditer(text)]
    found = [f for f in found if f not in RULES]
    assert not found, f"{page_id(page)}: figures, dates and machines belong on the Benchmarks page: {found}"


def test_every_marker_says_why_and_the_marked_set_stays_small() -> None:
    marked = [(page_id(p), s.text) for p in doc_pages() for s in snippets(p.read_text(encoding="utf-8")) if s.not_run]
    assert all(re.search(r"not run in tests: \w", text) for _, text in marked if not text.startswith("#"))
    run = [s for p in doc_pages() for s in snippets(p.read_text(encoding="utf-8")) if s.runs]
    assert len(marked) < len(run), f"more commands skipped ({len(marked)}) than run ({len(run)}): {marked}"


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """The site builds with every warning an error (a broken link or anchor in Markdown, a missing
    page, a docstring mkdocstrings cannot render); then every link and anchor of the built HTML
    resolves, the lab notes and charts are published, and no page shows a raw reST role."""
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "embed-corpus" in cli and "triton build" in cli, "the CLI reference lacks commands"
    export = (tmp_path / "site" / "reference" / "cli" / "export" / "index.html").read_text(encoding="utf-8")
    assert "--int8-recipe" in export, "export's page lacks its options"
    corpus = (tmp_path / "site" / "reference" / "cli" / "embed-corpus" / "index.html").read_text(encoding="utf-8")
    assert 'id="examples"' in corpus and "--threads-per-worker" in corpus, "embed-corpus's page lacks its examples"
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert 'id="kvembed.runtime.embedder.Embedder.load"' in api
    site = tmp_path / "site"
    assert dead_links(site) == []
    assert (site / "lab" / "peers" / "index.html").is_file() and (site / "assets" / "charts" / "peers.svg").is_file()
    roles = {page.relative_to(site).as_posix(): sorted(set(ROLE.findall(page.read_text(encoding="utf-8"))))
             for page in site.rglob("*.html") if "lab" not in page.parts}
    assert {page: found for page, found in roles.items() if found} == {}, "raw reST roles on the site"


#: a reST role as a page would show it raw (``:meth:`Embedder.load```)
ROLE = re.compile(r":(?:meth|class|func|attr|mod|data|exc|obj|ref|doc):(?:`|<code>)")


class _Page(HTMLParser):
    """A built page's link targets (``href`` and ``src``) and element ids."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            elif name in ("href", "src") and value:
                self.links.append(value)


def dead_links(site: Path) -> list[str]:
    """Every internal link of the built site that names no file or no anchor there: ``PAGE -> TARGET``."""
    pages: dict[Path, _Page] = {}
    for page in site.rglob("*.html"):
        parsed = _Page()
        parsed.feed(page.read_text(encoding="utf-8"))
        pages[page.resolve()] = parsed
    dead = []
    for page, parsed in pages.items():
        for link in parsed.links:
            if re.match(r"^[a-z][a-z0-9+.-]*:", link) or link.startswith("//"):
                continue  # another site's (or mailto:, data:)
            path, _, fragment = unquote(link).partition("#")
            target = page if not path else (site / path.lstrip("/") if path.startswith("/") else page.parent / path).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                dead.append(f"{page.relative_to(site.resolve())} -> {link}")
            elif fragment and target.suffix == ".html" and fragment not in pages[target].ids:
                dead.append(f"{page.relative_to(site.resolve())} -> {link} (no such anchor)")
    return sorted(set(dead))


def test_the_cli_reference_is_the_command_tree() -> None:
    """Every command of ``kvembed --help`` is in the documented tree, ``export`` with its own options."""
    import typer

    from kvembed.cli.main import app
    from kvembed.cli.reference import kvembed_command

    documented = kvembed_command()
    live = typer.main.get_command(app)
    assert set(documented.commands) == set(live.commands)
    assert "int8_recipe" in {p.name for p in documented.commands["export"].params}
    assert "export" in live.commands["export"].commands, "the app's own tree was changed by the docs view"


#: commands a page's run leaves out because the suite runs each as written elsewhere, on the same
#: export of the demo model (the session fixture's): command -> (test file, the call there)
RUN_ELSEWHERE = {
    "kvembed verify artifacts/stories260k-kv": ("test_backends.py", 'runner.invoke(app, ["verify", str(artifact)])'),
}


def test_what_a_page_leaves_out_runs_as_written_elsewhere() -> None:
    """Each command of :data:`RUN_ELSEWHERE` is on a page, and the test named runs it: the page's
    run may skip it only while that holds."""
    on_pages = {s.text for p in doc_pages() for s in snippets(p.read_text(encoding="utf-8")) if s.runs}
    for command, (test_file, call) in RUN_ELSEWHERE.items():
        assert command in on_pages, f"{command!r} is on no page any more: drop it from RUN_ELSEWHERE"
        assert call in (ROOT / "tests" / test_file).read_text(encoding="utf-8"), f"{test_file} no longer runs {command!r}"


def script(steps: list[Snippet]) -> str:
    """A bash script of the snippets that run, in page order (python blocks as here-documents),
    without those the suite runs elsewhere (:data:`RUN_ELSEWHERE`)."""
    lines = ["set -euxo pipefail"]
    for step in steps:
        if step.runs and step.text not in RUN_ELSEWHERE:
            lines.append(step.text if step.lang == "bash" else f"python - <<'PY'\n{step.text}PY")
    return "\n".join(lines) + "\n"


def run_page(page: Path, where: Path) -> None:
    steps = snippets(page.read_text(encoding="utf-8"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore", "COLUMNS": "120"}
    done = subprocess.run(["bash", "-c", script(steps)], cwd=where, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"{page_id(page)}'s commands failed in {where}:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder after getting-started.md's commands: the demo artifact every guide builds on."""
    where = tmp_path_factory.mktemp("getting-started")
    run_page(GETTING_STARTED, where)
    return where


def test_getting_started_runs(started: Path) -> None:
    assert (started / "artifacts" / "stories260k-kv" / "kvembed.json").is_file()


def beside(started: Path, where: Path) -> None:
    """``where`` sees what getting-started wrote (links; artifacts/ a folder of its own, so a guide's
    exports do not land in the shared one)."""
    for entry in started.iterdir():
        if entry.name == "artifacts":
            (where / "artifacts").mkdir()
            for artifact in entry.iterdir():
                (where / "artifacts" / artifact.name).symlink_to(artifact)
        else:
            (where / entry.name).symlink_to(entry)


@pytest.mark.parametrize("page", GUIDES, ids=page_id)
def test_the_guide_runs_on_the_demo_model(page: Path, started: Path, tmp_path: Path) -> None:
    runnable = [s for s in snippets(page.read_text(encoding="utf-8")) if s.runs]
    if not runnable:
        pytest.skip(f"{page_id(page)}: every command is marked or setup (see its '# not run in tests:' reasons)")
    beside(started, tmp_path)
    run_page(page, tmp_path)


def test_the_api_page_lists_every_route_of_the_server() -> None:
    """The Python API page's route table is the app's routes (method and path), no more, no less."""
    from kvembed.serve import ServeConfig, create_app

    app = create_app(ServeConfig(artifacts=(("m", ROOT / "no-such-artifact"),)))
    served = {(method, route.path) for route in app.routes for method in getattr(route, "methods", None) or ()
              if method != "HEAD"}
    listed = set(re.findall(r"^\| `(GET|POST) (/[^`]*)` \|", (DOCS / "reference" / "api.md").read_text(encoding="utf-8"), re.MULTILINE))
    assert listed == served
