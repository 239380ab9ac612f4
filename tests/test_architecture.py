"""The layout rules of docs/architecture.md, checked on the source: who may import whom (lazy
imports included), module length, and no measured figures in kvembed's prose."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "kvembed"
MAX_LINES = 600

#: room -> level; a module may import only rooms of a lower level, or its own room
LEVELS = {
    "leaves": 0, "methods": 1, "artifact": 2, "backends": 3, "runtime": 4,
    "serve": 5, "triton": 5, "corpus": 5, "bundle": 5, "modeling": 5,
    "export": 6, "eval": 7, "bench": 7, "cli": 8, "api": 9,
}
LEAVES = {"errors", "cache", "lazy", "sizes", "extras", "version", "status", "flagfields", "signals", "data"}
#: rooms laid out in sub-rooms by job: room -> {sub-room (a folder) or leaf module: level inside the
#: room}; the room's other modules (its pipeline) share the top level, :data:`SUB_TOP`. Inside such a
#: room a module may import only sub-rooms of a lower level, or its own sub-room.
SUB_LEVELS = {
    "export": {"onnx_nodes": 0, "progress": 0, "memory": 0, "source": 0, "graph": 1, "precision": 1, "gate": 2},
}
SUB_TOP = 3


def room_of(module: str) -> str:
    """``kvembed`` itself is the public facade (``from kvembed import Embedder``): the top room."""
    parts = module.split(".")
    if len(parts) == 1:
        return "api"
    name = parts[1]
    if name in LEAVES:
        return "leaves"
    return name


def sub_room_of(module: str) -> tuple[str, int] | None:
    """``module``'s sub-room and its level inside its room (:data:`SUB_LEVELS`), or None for a room
    without sub-rooms. The room's package itself and its other modules are the room's top."""
    room = room_of(module)
    if room not in SUB_LEVELS:
        return None
    parts = module.split(".")
    name = parts[2] if len(parts) > 2 else ""
    return (name, SUB_LEVELS[room][name]) if name in SUB_LEVELS[room] else ("top", SUB_TOP)


def modules(package: Path = PACKAGE) -> list[tuple[str, Path]]:
    found = []
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append((".".join(parts), path))
    return found


def imported(module: str, path: Path, root: Path = PACKAGE.parent) -> set[str]:
    """The kvembed modules ``module`` (at ``path``, under the import root ``root``) imports, lazy
    imports included."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if node.module is None:  # ``from .. import x``: x is a submodule, or a name of the package
                for alias in node.names:
                    sub = root.joinpath(*target.split("."), alias.name)
                    targets.add(f"{target}.{alias.name}" if sub.is_dir() or sub.with_suffix(".py").is_file() else target)
            else:
                targets.add(target)
        elif isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
    return {t for t in targets if t == "kvembed" or t.startswith("kvembed.")}


def test_every_room_is_known_and_documented() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rooms = {room_of(module) for module, _ in modules()}
    assert rooms <= set(LEVELS), f"rooms missing from LEVELS: {sorted(rooms - set(LEVELS))}"
    for room in rooms - {"leaves"}:
        assert f"`{room}/`" in doc, f"docs/architecture.md does not describe {room}/"


def test_imports_go_down_the_levels_only() -> None:
    wrong = []
    for module, path in modules():
        mine = room_of(module)
        for target in imported(module, path):
            theirs = room_of(target)
            if theirs != mine and LEVELS.get(theirs, 99) >= LEVELS.get(mine, -1):
                wrong.append(f"{module} ({mine}) imports {target} ({theirs})")
    assert not wrong, "imports against docs/architecture.md:\n" + "\n".join(sorted(wrong))


def test_sub_rooms_import_one_way() -> None:
    """Inside a room with sub-rooms (export: leaves -> graph/ and precision/ -> gate/ -> the
    pipeline), imports go down the sub-room levels only; graph/ and precision/ do not import each other."""
    wrong = []
    for module, path in modules():
        mine = sub_room_of(module)
        if mine is None:
            continue
        for target in imported(module, path):
            theirs = sub_room_of(target) if room_of(target) == room_of(module) else None
            if theirs is not None and theirs[0] != mine[0] and theirs[1] >= mine[1]:
                wrong.append(f"{module} ({mine[0]}) imports {target} ({theirs[0]})")
    assert not wrong, "imports against the sub-rooms of docs/architecture.md:\n" + "\n".join(sorted(wrong))


#: what code outside backends/ may import from it: the registry (the catalogue of backends and the
#: target registry), the session contract, and the CPU's facts; never a backend's own file
BACKENDS_FACADE = {"kvembed.backends", "kvembed.backends.catalogue", "kvembed.backends.targets",
                   "kvembed.backends.protocol", "kvembed.backends.cpu"}


def test_backend_files_are_reached_through_the_registry_only() -> None:
    wrong = [f"{module} imports {target}" for module, path in modules() if room_of(module) != "backends"
             for target in imported(module, path) if room_of(target) == "backends" and target not in BACKENDS_FACADE]
    assert not wrong, "imports of backend files from outside backends/ (take them from BACKENDS[name].load()):\n" + "\n".join(sorted(wrong))


def test_a_backend_file_import_from_outside_is_found(tmp_path: Path) -> None:
    """The rule above fails where it should: a planted module importing onnxruntime.py's file."""
    planted = tmp_path / "kvembed" / "serve" / "planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("from ..backends.onnxruntime import session_options\nfrom ..backends.catalogue import BACKENDS\n")
    found = imported("kvembed.serve.planted", planted, tmp_path)
    assert {t for t in found if room_of(t) == "backends" and t not in BACKENDS_FACADE} == {"kvembed.backends.onnxruntime"}


def test_every_sub_room_exists_and_is_documented() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for room, levels in SUB_LEVELS.items():
        for name in levels:
            folder, module = PACKAGE / room / name, PACKAGE / room / f"{name}.py"
            assert folder.is_dir() or module.is_file(), f"{room}/{name} named in SUB_LEVELS does not exist"
            shown = f"`{room}/{name}/`" if folder.is_dir() else f"`{name}.py`"
            assert shown in doc, f"docs/architecture.md does not describe {shown}"


def test_no_module_is_longer_than_the_limit() -> None:
    long = {str(p.relative_to(ROOT)): n for _, p in modules() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


#: a measured figure: a number with a unit of time, size, share, rate or ratio
FIGURE = re.compile(
    r"(?<![\w.`])\d+(?:[.,]\d+)?\s?(?:ms|us|µs|MB|GB|KB|GiB|MiB|%|tokens/s|texts/s|GFLOP/s)(?![\w/])"
    r"|(?<![\w.`])\d+\.\d+x(?!\w)|\b\d+x (?:faster|slower)"
)
ISSUE = re.compile(r"\bissue\s+#?\d+", re.IGNORECASE)
#: rules and limits, not measurements
ALLOWED = {"2 GiB", "2 GB", "50 MB", "10%", "100%"}


def prose(path: Path):
    source = path.read_text(encoding="utf-8")
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc


def test_no_measured_figures_or_issue_numbers_in_prose() -> None:
    found = []
    for _, path in modules():
        for line, text in prose(path):
            text = re.sub(r"``.*?``", "", text, flags=re.DOTALL)
            for match in [*FIGURE.finditer(text), *ISSUE.finditer(text)]:
                if match.group(0) not in ALLOWED:
                    found.append(f"{path.relative_to(ROOT)}:{line}: {match.group(0)!r}")
    assert not found, "figures belong in benchmarks/log/ and benchmarks/results/, issue numbers nowhere in code:\n" + "\n".join(found)


@pytest.mark.parametrize("module", ["kvembed.runtime", "kvembed.serve", "kvembed.triton", "kvembed.corpus", "kvembed.backends"])
def test_the_torch_free_rooms_do_not_import_torch(module: str) -> None:
    room = module.split(".")[1]
    users = [m for m, p in modules() if room_of(m) == room and any(
        isinstance(n, (ast.Import, ast.ImportFrom)) and any(
            (a.name if isinstance(n, ast.Import) else (n.module or "")).split(".")[0] in ("torch", "transformers")
            for a in n.names) for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))))]
    assert not users, f"{room}/ must stay torch-free: {users}"


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` (module -> modules it imports) as a path ``[a, b, ..., a]``, or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_import_cycle_finds_a_circle() -> None:
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the package's modules it imports. Importing ``a.b.c`` runs the packages ``a`` and
    ``a.b`` first, so they count as imported too (except the importer's own packages, which are
    already loading)."""
    inside = dict(modules(package))
    graph: dict[str, set[str]] = {}
    for module, path in inside.items():
        own = {module.rsplit(".", n)[0] for n in range(1, module.count(".") + 1)}
        targets = set()
        for target in imported(module, path, package.parent):
            parts = target.split(".")
            targets.update(".".join(parts[:n]) for n in range(1, len(parts) + 1))
        graph[module] = {t for t in targets - own - {module} if t in inside}
    return graph


def test_no_module_imports_itself_through_a_circle() -> None:
    """A circle, even through lazy imports inside functions, makes every module on it load every
    other and hides which depends on which; shared helpers belong in a leaf both import."""
    cycle = import_cycle(import_graph())
    assert not cycle, "imports in a circle: " + " -> ".join(cycle)


@pytest.mark.parametrize("room", ["backends", "export", "cli"])
def test_a_planted_circle_is_found_in_any_room(tmp_path: Path, room: str) -> None:
    """A package laid out like kvembed: two modules of one room, one importing the other at the top
    and the other importing it back inside a function (the lazy import that hid the old circles)."""
    package = tmp_path / "kvembed"
    (package / room).mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / room / "__init__.py").write_text("")
    (package / room / "first.py").write_text("from .second import helper\n")
    (package / room / "second.py").write_text("def helper():\n    return 1\n")
    assert not import_cycle(import_graph(package))
    (package / room / "second.py").write_text("def helper():\n    from . import first\n    return first\n")
    assert set(import_cycle(import_graph(package))) == {f"kvembed.{room}.first", f"kvembed.{room}.second"}


def test_no_benchmark_imports_the_tests_helpers():
    """What benchmarks and tests both drive lives in the package (kvembed.bench.served, ...): a
    benchmark that put ``tests/`` on its path would run only from a checkout with the tests' fixtures."""
    leaning = [str(path.relative_to(ROOT)) for path in sorted((ROOT / "benchmarks").rglob("*.py"))
               if re.search(r"""["']tests["']|^\s*(from|import) (serve_util|triton_util|causal2vec_util|checks|independent)\b""",
                            path.read_text(encoding="utf-8"), re.M)]
    assert not leaning, leaning
