"""Each concept of issue 23's "one home per concept" is spelled in its home only.

A source scan (no import): the output folder's names outside :mod:`cpmatrix.layout`, a
folder's ``durations.json`` read or written outside :mod:`cpmatrix.report.history`, a
parity check's name as a string literal outside :mod:`cpmatrix.parity.errors` (the frozen
modules keep their literals: a ``Check`` member equals its string).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from cpmatrix import layout

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "cpmatrix"

#: The output folder's file names (its folder names, "cells", "worlds", "spill", are
#: words used for other things too: they are left to review).
LAYOUT_NAMES = frozenset({layout.MARKER, layout.LOCK, layout.REPORT_XML, layout.RESULTS,
                          layout.REPORT_HTML, layout.RUN_INFO, layout.DURATIONS,
                          layout.SHARD_MANIFEST, layout.OUTPUT_LOG, layout.STACKS})
#: Spellings inside a longer string: a path ending in one of the names, a world's JUnit.
PIECES = (".junit.xml", *(f"/{name}" for name in sorted(LAYOUT_NAMES)))
#: Frozen modules (never edited): what they spell stays.
FROZEN = {"cache/key.py", "parity/verdict.py", "parity/checks.py", "parity/compare.py",
          "parity/tolerance.py", "gate/_checks.py"}


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """The string literals of a module's code: docstrings and other bare strings left out,
    each piece of an f-string in."""
    tree = ast.parse(path.read_text())
    bare = {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in bare]


def _sources(*skip: str, root: Path = PACKAGE) -> list[tuple[str, Path]]:
    return [(rel, p) for p in sorted(root.rglob("*.py"))
            if (rel := p.relative_to(root).as_posix()) not in {*skip, *FROZEN}]


def _found(names: frozenset[str], *skip: str, pieces: tuple[str, ...] = (),
           root: Path = PACKAGE) -> list[str]:
    return [f"{rel}:{line}: {text!r}" for rel, p in _sources(*skip, root=root)
            for line, text in _code_strings(p)
            if text in names or any(piece in text for piece in pieces)]


def test_the_scans_read_the_package() -> None:
    assert len(_sources()) > 100  # a wrong PACKAGE would scan nothing and pass


def test_the_output_folder_is_spelled_in_layout_only() -> None:
    found = _found(LAYOUT_NAMES, "layout.py", pieces=PIECES)
    assert not found, "name these through cpmatrix.layout:\n" + "\n".join(found)


def test_a_folder_history_is_read_and_written_by_history_only() -> None:
    found = [f"{rel}: {name}" for rel, p in _sources("report/history.py")
             for name in ("load_histories", "history_json")
             if name in p.read_text()]
    assert not found, ("read and write a folder's durations.json with load_run_history and "
                       "save_run_history:\n" + "\n".join(found))


@pytest.mark.parametrize("text", sorted(LAYOUT_NAMES))
def test_the_scan_sees_a_planted_spelling(tmp_path: Path, text: str) -> None:
    """Through the scan the test above runs: a spelling in code is found, the same name
    in a docstring is not, and the home itself is skipped."""
    (tmp_path / "supervise").mkdir()
    (tmp_path / "supervise" / "m.py").write_text(
        f'"""Docs may name {text}."""\nPATH = "out" / "{text}"\nSHOWN = f"{{out}}/{text}"\n')
    (tmp_path / "layout.py").write_text(f'NAME = "{text}"\n')
    assert _found(LAYOUT_NAMES, "layout.py", pieces=PIECES, root=tmp_path) == [
        f"supervise/m.py:2: {text!r}", f"supervise/m.py:3: {'/' + text!r}"]


def test_every_kind_is_run_by_exactly_one_executor() -> None:
    from cpmatrix.kinds.executors import EXECUTORS
    from cpmatrix.matrix.schema import KINDS
    from cpmatrix.supervise.executors.base import executor_for

    declared = [kind for e in EXECUTORS for kind in e.kinds]
    assert sorted(declared) == sorted(KINDS), "matrix.schema.KINDS and the executors' kinds"
    assert len(declared) == len(set(declared)), "a kind run by two executors"
    assert all(kind in executor_for(EXECUTORS, kind).kinds for kind in KINDS)
    with pytest.raises(KeyError):
        executor_for(EXECUTORS, "fuzz")


def test_parity_check_names_are_check_members() -> None:
    """A check's name as a literal (the frozen modules aside): ``Check.X`` instead."""
    from cpmatrix.parity.errors import CHECKS

    names = frozenset(CHECKS)
    # Where parity checks are named: the toolkit and the suite that uses it. Elsewhere
    # these are common words of other things ("setup" is also pytest's phase, "output"
    # a model's head).
    found = [f for f in _found(names, "parity/errors.py")
             if f.startswith(("parity/", "suite/"))]
    assert not found, "name these checks as cpmatrix.parity.Check members:\n" + \
        "\n".join(found)


def test_a_cells_fields_reach_the_case_through_one_conversion() -> None:
    """Cell -> CellSpec -> CellContext: every field the spec and the context share with
    the cell arrives, none set by hand on the way (``from_cell``, ``from_spec``); a kind's
    payload (``spill``, ``pytest``) too, so no executor patches the spec after
    ``from_cell``."""
    import json
    from dataclasses import fields, replace

    from cpmatrix.cell import CellContext
    from cpmatrix.matrix.schema import Cell, Mesh
    from cpmatrix.worker.protocol import CellSpec, PytestSpec

    cell = Cell(id="t[layer,2x3,bf16,autocast=on,kernel]@cuda", target="t", case="m:f",
                kind="property", level="layer", mesh=Mesh.parse("2x3"), dtype="bf16",
                autocast=True, path="kernel", params=(("seq", 7),), platform="cuda",
                timeout_s=42, tags=(), case_file="/src/m.py",
                spill=json.dumps({"kernel": "k.py:add", "arch": "sm_90"}),
                pytest=json.dumps({"nodeid": "t.py::x", "dialect": "marker", "session": "{}"}))
    spec = CellSpec.from_cell(cell, out_dir="cells/x", mutant="off_by_one", run_number=3)
    assert CellSpec.from_json(spec.to_json()) == spec
    parsed = {"params": dict(cell.params), "spill": cell.spill_spec(),
              "pytest": PytestSpec(nodeid="t.py::x", dialect="marker", session="{}")}
    for f in fields(CellSpec):
        if hasattr(cell, f.name):
            want = parsed.get(f.name, getattr(cell, f.name))
            assert getattr(spec, f.name) == want, f.name
    assert spec.spill == {"kernel": "k.py:add", "arch": "sm_90"}
    # A cell of another kind carries no payload.
    plain = CellSpec.from_cell(replace(cell, spill="", pytest=""), out_dir="x")
    assert (plain.spill, plain.pytest) == (None, None)
    assert (spec.rows, spec.cols, spec.world_size) == (2, 3, 6)
    assert (spec.out_dir, spec.mutant, spec.run_number) == ("cells/x", "off_by_one", 3)

    ctx = CellContext.from_spec(spec, rank=5, mesh="m", device="d", backend="nccl",
                                dtype="bfloat16", seed=9, generator="g", out_dir=Path("o"))
    for f in fields(CellContext):
        if hasattr(spec, f.name) and f.name not in ("dtype", "out_dir"):
            assert getattr(ctx, f.name) == getattr(spec, f.name), f.name
    assert (ctx.dtype_name, ctx.rank, ctx.world_size) == ("bf16", 5, 6)


def test_cell_specs_and_contexts_are_made_by_their_conversions_only() -> None:
    homes = {"CellSpec": {"worker/protocol/records.py"}, "CellContext": {"cell.py"}}
    found = []
    for rel, p in _sources():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and rel not in homes.get(node.func.id, {rel}):
                found.append(f"{rel}:{node.lineno}: {node.func.id}(...)")
    assert not found, "use CellSpec.from_cell / CellContext.from_spec:\n" + "\n".join(found)


#: Who may call what puts a run together: supervise/assembly.py's assemble() is the one path of
#: every front (run, repro, the pytest plugin), the context and what is known of the cells
#: made once, whole; a folder's recorded history is read once, by sharding.Recorded, and
#: handed down (the report's merge and HTML read the history a run wrote).
ASSEMBLY = {"prepare_run": {"supervise/assembly.py"}, "run_cells": {"supervise/assembly.py"},
            "make_context": {"supervise/assembly.py"}, "RunContext": {"supervise/setup.py"},
            "Known": {"supervise/assembly.py", "supervise/session.py"},
            "load_run_history": {"supervise/sharding.py", "report/merge.py", "report/html.py"}}
#: What assemble() made is not changed after it: no ``replace`` of these.
MADE_ONCE = ("context", "ctx", "known")


def _calls(source: str, homes: dict[str, set[str]], rel: str) -> list[str]:
    """Calls of ``homes``' names outside their homes, and ``replace(...)`` of what the
    assembly made (:data:`MADE_ONCE`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else \
            node.func.attr if isinstance(node.func, ast.Attribute) else ""
        if rel not in homes.get(name, {rel}):
            found.append(f"{rel}:{node.lineno}: {name}(...)")
        elif name == "replace" and node.args and ast.unparse(node.args[0]).split(".")[-1] \
                in MADE_ONCE:
            found.append(f"{rel}:{node.lineno}: replace({ast.unparse(node.args[0])}, ...)")
    return found


def test_a_run_is_assembled_in_one_place_and_its_context_made_once() -> None:
    found = [f for rel, p in _sources() for f in _calls(p.read_text(), ASSEMBLY, rel)]
    assert not found, "a run is put together by supervise/assembly.py's assemble():\n" + \
        "\n".join(found)


def test_the_assembly_scan_sees_a_second_path() -> None:
    planted = ("def execute_again(options, matrix, cells, claim, context):\n"
               "    prepared = prepare_run(options, matrix, cells, claim)\n"
               "    context = replace(context, pack=None)\n"
               "    return run_cells(prepared.cells, {}, context)\n"
               "def repro_again(run, out):\n"
               "    history = load_run_history(out)\n"
               "    return replace(run, known=replace(run.known, skipped=()))\n")
    assert _calls(planted, ASSEMBLY, "cli/run.py") == [
        "cli/run.py:2: prepare_run(...)", "cli/run.py:3: replace(context, ...)",
        "cli/run.py:4: run_cells(...)", "cli/run.py:6: load_run_history(...)",
        "cli/run.py:7: replace(run.known, ...)"]
    assert _calls(planted, ASSEMBLY, "supervise/assembly.py") == [
        "supervise/assembly.py:3: replace(context, ...)",
        "supervise/assembly.py:6: load_run_history(...)",
        "supervise/assembly.py:7: replace(run.known, ...)"]


#: Who plans a run, and how often: the plan is made once, by make_plan over the placement
#: place_cells found, in assemble() for a run and in plan_only() for ``--dry-run``; the
#: session executes it as given. A placement's parts (devices and fits, pack, worlds, the
#: durations to pack by) are asked in place_cells only; no other function plans (plan_all).
PLANNING = {"make_plan": {"supervise/assembly.py": 1, "supervise/pipeline.py": 1},
            "place_cells": {"supervise/assembly.py": 1, "supervise/pipeline.py": 1},
            "devices_for": {"supervise/assembly.py": 1}, "pack_spec": {"supervise/assembly.py": 1},
            "worlds": {"supervise/assembly.py": 1}, "planning": {"supervise/assembly.py": 1},
            "plan_all": {}}
#: A planner's ``plan`` (and a pack's) is called in the plan stage and the kinds only (an
#: executor plans its own cells; a world packs the cells handed back to it).
PLANNERS = ("plan/", "kinds/")


def _planning(sources: list[tuple[str, str]]) -> list[str]:
    """What plans outside :data:`PLANNING`'s homes, or there more often than it says."""
    counts: dict[str, dict[str, int]] = {name: {} for name in PLANNING}
    found = []
    for rel, source in sources:
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else \
                node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if name in counts:
                counts[name][rel] = counts[name].get(rel, 0) + 1
            elif name == "plan" and not rel.startswith(PLANNERS):
                found.append(f"{rel}:{node.lineno}: .plan(...)")
    found += [f"{name}: called {counts[name]}, not {want}" for name, want in PLANNING.items()
              if counts[name] != want]
    return found


def test_a_run_is_planned_once_and_run_as_planned() -> None:
    found = _planning([(rel, p.read_text()) for rel, p in _sources()])
    assert not found, ("a run's plan is made once (make_plan, in assemble and plan_only) "
                       "and executed as given:\n" + "\n".join(found))


def test_the_planning_scan_sees_a_plan_made_again() -> None:
    real = [(rel, p.read_text()) for rel, p in _sources()]
    again = [(rel, text.replace("    _queue(session, plan)\n",
                                "    _queue(session, make_plan(EXECUTORS, plan.placement))\n"))
             if rel == "supervise/session.py" else (rel, text) for rel, text in real]
    assert again != real  # (the plant took)
    assert _planning(again) == [
        "make_plan: called {'supervise/assembly.py': 1, 'supervise/pipeline.py': 1, "
        "'supervise/session.py': 1}, not {'supervise/assembly.py': 1, "
        "'supervise/pipeline.py': 1}"]
    planted = ("def run_cells(plan, executors, cells, settings):\n"
               "    batches = [ex.plan(cells, settings) for ex in executors]\n"
               "    return plan_all(executors, cells, settings)\n")
    assert _planning([*real, ("supervise/session.py", planted)]) == [
        "supervise/session.py:2: .plan(...)",
        "plan_all: called {'supervise/session.py': 1}, not {}"]
    twice = [(rel, text + "\ndef again(options):\n    return pack_spec(options)\n")
             if rel == "supervise/pipeline.py" else (rel, text) for rel, text in real]
    assert _planning(twice) == ["pack_spec: called {'supervise/assembly.py': 1, "
                                "'supervise/pipeline.py': 1}, not {'supervise/assembly.py': 1}"]
