"""The import graph keeps its layers (docs/architecture.md): no cycle, no arrow back up.

Reads every ``import`` of ``src/cpmatrix`` (top level and inside functions) without
importing anything, maps each module to its layer, and fails on an import of a higher
layer, on an import cycle between modules, and on a module over 500 lines.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "cpmatrix"

#: Bottom to top. A module may import its own layer and the ones below.
LAYERS: tuple[tuple[str, ...], ...] = (
    # The base, with the module names spelled as strings (module_names: stdlib only).
    ("cpmatrix", "cpmatrix.cell", "cpmatrix.result", "cpmatrix.errors", "cpmatrix.fsutil",
     "cpmatrix.digest", "cpmatrix.paths", "cpmatrix.layout", "cpmatrix.defaults",
     "cpmatrix.__main__", "cpmatrix.module_names"),
    # With the spec: the pytest kind's pure parts (a pytest target's cells, their sources,
    # the verdict over the ranks' reports). Its collector runs pytest: a front's, handed
    # to the expansion from above.
    ("cpmatrix.matrix", "cpmatrix.kinds.pytest.spec", "cpmatrix.kinds.pytest.session_spec",
     "cpmatrix.kinds.pytest.sources",
     "cpmatrix.kinds.pytest.verdict", "cpmatrix.kinds.pytest.records"),
    ("cpmatrix.parity", "cpmatrix.suite", "cpmatrix.recipes"),
    ("cpmatrix.spill",),
    # The code that runs in the worlds' ranks, the pytest kind's rank side with it.
    ("cpmatrix.worker", "cpmatrix.kinds.pytest.rank_session", "cpmatrix.kinds.pytest.rank_dialects",
     "cpmatrix.kinds.pytest.preload"),
    ("cpmatrix.report",),
    # The run's stages below the supervisor: the result cache and the placement of cells.
    ("cpmatrix.cache", "cpmatrix.plan"),
    # The supervisor, with each kind's executor and job.
    ("cpmatrix.supervise", "cpmatrix.kinds.world", "cpmatrix.kinds.compile",
     "cpmatrix.kinds.pytest.executor"),
    # Above the core: the registry of the executors by kind (handed down by the fronts),
    # and the kinds' fronts: the pytest plugin, its controller and collector, on the run.
    ("cpmatrix.kinds",),
    ("cpmatrix.gate",),
    ("cpmatrix.cli",),
)
#: Known exceptions, each with its reason. Keep empty.
ALLOWED: dict[tuple[str, str], str] = {
    # `python -m cpmatrix` runs the CLI: the package's entry point sits on top by nature.
    ("cpmatrix.__main__", "cpmatrix.cli"): "the console entry point",
}


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    rel = path.relative_to(package.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, name: str) -> set[str]:
    return _imports_of(ast.parse(path.read_text()), path, name)


def _imports_of(tree: ast.Module, path: Path, name: str) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
    return {m for m in found if m.startswith("cpmatrix")}


def _graph(*, inits: bool = False) -> dict[str, set[str]]:
    """Each module's imports of the package's modules; with ``inits``, also the packages
    whose ``__init__`` such an import runs first (what a cycle at import time goes through)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = {m for m in _imports(path, name) if m in modules and m != name}
        if inits:
            # Importing a.b.c runs a.b's __init__ first: from outside a.b, an import of it.
            found |= {parent for m in found for parent in _parents(m) if parent in modules
                      and not name.startswith(parent + ".") and parent != name}
        graph[name] = found
    return graph


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def _layer(module: str) -> int:
    best, depth = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > depth:
                best, depth = i, len(prefix)
    assert best >= 0, f"{module} is on no layer: add it to LAYERS (and docs/architecture.md)"
    return best


#: The one module that spells cpmatrix's module paths as strings.
REGISTRY = PACKAGE / "module_names.py"


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """A module's string literals, docstrings left out, each piece of an f-string in."""
    tree = ast.parse(path.read_text())
    bare = {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in bare]


def _module_paths_spelled(path: Path) -> list[str]:
    tops = "|".join(sorted(p.stem for p in PACKAGE.iterdir()
                           if p.suffix == ".py" or (p.is_dir() and p.name != "__pycache__")))
    # A whole string that is a module (or its ``module:function``), or one run with -m.
    module = re.compile(rf"cpmatrix\.(?:{tops})(?:\.\w+)*(?::\w+)?")
    run = re.compile(rf"-m cpmatrix\.(?:{tops})(?![\w])")
    return [f"{path.relative_to(SRC)}:{line}: {text!r}" for line, text in _code_strings(path)
            # A regular expression's escaped dots are dots.
            for text in [text.replace("\\.", ".")]
            if module.fullmatch(text) or run.search(text)
            # or a class named with its module (a traceback's last line).
            or re.search(rf"cpmatrix\.(?:{tops})(?:\.[a-z_]\w*)*\.[A-Z]\w*", text)]


def test_module_paths_are_spelled_in_module_names_only() -> None:
    """A module run with ``-m`` or loaded by name is a string no import check follows:
    all of them are constants of ``module_names.py``, imported wherever used."""
    found = [hit for p in sorted(PACKAGE.rglob("*.py")) if p != REGISTRY
             for hit in _module_paths_spelled(p)]
    assert found == [], "module paths spelled outside module_names.py:\n" + "\n".join(found)
    assert len(_module_paths_spelled(REGISTRY)) >= 10  # the scan reads what it should


def test_no_import_runs_back_up_a_layer() -> None:
    graph = _graph()
    up = sorted((a, b) for a, targets in graph.items() for b in targets
                if _layer(b) > _layer(a) and (a, b) not in ALLOWED
                # A package's __init__ re-exports what is inside it.
                and not b.startswith(a + "."))
    assert up == [], "imports running back up a layer:\n" + "\n".join(f"{a} -> {b}"
                                                                        for a, b in up)


def test_there_is_no_import_cycle() -> None:
    graph = _graph(inits=True)
    # Package __init__ -> its own submodules is a re-export, not a dependency back.
    edges = {a: {b for b in bs if not b.startswith(a + ".")} for a, bs in graph.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_is_over_500_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= 500, f"{path.relative_to(SRC)} has {lines} lines: split it by concept"


def test_the_checks_are_not_vacuous(tmp_path: Path) -> None:
    """A planted back-arrow and a planted cycle are found (on a copy of the graph)."""
    graph = _graph()
    assert _layer("cpmatrix.matrix.load") < _layer("cpmatrix.cli.run")
    graph["cpmatrix.matrix.load"] = {*graph["cpmatrix.matrix.load"], "cpmatrix.cli.run"}
    assert any(_layer(b) > _layer(a) for a, bs in graph.items() for b in bs
               if (a, b) not in ALLOWED and not b.startswith(a + "."))
    # The registry of the executors by kind is built above the core and handed down:
    # the core importing it runs back up.
    assert _layer("cpmatrix.supervise.session") < _layer("cpmatrix.kinds.executors")
    # So is the pytest kind's collector: the spec is handed it by whoever expands.
    assert _layer("cpmatrix.matrix.expand") < _layer("cpmatrix.kinds.pytest.collect")


#: The modules a world's processes start from (its ranks, the fork launcher, a container's
#: watchdog) and the pytest kind's rank side they load by name.
RANK_ENTRIES = ("cpmatrix.worker.world_main", "cpmatrix.worker.forkrun",
                "cpmatrix.worker.watchdog", "cpmatrix.kinds.pytest.rank_session")


def _runtime_imports(path: Path, name: str) -> set[str]:
    """Like :func:`_imports`, without what only a type checker runs (``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    return _imports_of(tree, path, name)


def _closure(roots: tuple[str, ...], root: Path = PACKAGE) -> set[str]:
    """Every module of the package that importing ``roots`` runs (their packages' __init__
    included), read from the sources."""
    modules = {_module_name(p, root): p for p in root.rglob("*.py")}
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name not in modules:
            continue
        seen.add(name)
        found = {m for m in _runtime_imports(modules[name], name) if m in modules}
        todo.extend(found | {p for m in found | {name} for p in _parents(m) if p in modules})
    return seen


def test_a_worlds_processes_import_nothing_of_the_spec_side() -> None:
    """A world's processes run none of the spec side's modules: the cell reaches them as
    the wire's ``CellSpec`` (docs/architecture.md, "A cell's shapes"), never as the
    matrix's objects. (The cache key counts more than this closure: it reads type-only
    imports too, erring toward a miss.)"""
    closure = _closure(RANK_ENTRIES)
    assert set(RANK_ENTRIES) <= closure  # the roots were found: a renamed one is no pass
    assert not {m for m in closure if m.startswith("cpmatrix.matrix")}, sorted(closure)


def test_the_closure_sees_a_spec_import(tmp_path: Path) -> None:
    """Through the closure the test above takes: an import of the schema two steps away
    is found, one under ``if TYPE_CHECKING:`` is not."""
    pkg = tmp_path / "cpmatrix"
    for folder in (pkg / "worker", pkg / "matrix"):
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "matrix" / "schema.py").write_text("")
    (pkg / "worker" / "world_main.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from cpmatrix.matrix.schema import Cell\nfrom cpmatrix.worker import helper\n")
    (pkg / "worker" / "helper.py").write_text("def f():\n    import cpmatrix.matrix.schema\n")
    assert "cpmatrix.matrix.schema" in _closure(("cpmatrix.worker.world_main",), pkg)
    (pkg / "worker" / "helper.py").write_text("")
    assert not any(m.startswith("cpmatrix.matrix") for m in
                   _closure(("cpmatrix.worker.world_main",), pkg))
