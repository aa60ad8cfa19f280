"""The world protocol (``cpmatrix.worker.protocol``): named once, spelled nowhere else.

Its typed records round-trip and refuse what is not theirs; its store words parse back;
and neither side of the protocol (the ranks in ``worker/``, the supervisor in
``supervise/executors/``) spells one of its file names, store keys or words by hand.
"""

from __future__ import annotations

import ast
import doctest
import re
from pathlib import Path

import pytest

from cpmatrix.supervise.executors.attribution import launcher_root_cause
from cpmatrix.worker import protocol
from cpmatrix.worker.protocol import (
    CellSpec,
    PeerReport,
    PytestSpec,
    Ready,
    RootCause,
    WorldFolder,
    WorldSpec,
    folders,
    read_typed,
    records,
    store,
    write_typed,
)
from cpmatrix.worker.subworld import SubWorld

SRC = Path(__file__).resolve().parents[2] / "src" / "cpmatrix"
#: The two sides of the protocol (the kinds' executors and jobs with the supervisor's).
SIDES = (SRC / "worker", SRC / "supervise" / "executors", SRC / "kinds" / "world",
         SRC / "kinds" / "compile", SRC / "kinds" / "pytest" / "executor.py",
         SRC / "kinds" / "pytest" / "rank_session.py")

#: What the protocol spells: a string literal (or an f-string's text) of either side
#: matching one of these is a spelling by hand.
SPELLINGS = {
    "file names": re.compile(
        r"\.(pid|left)$|^\.log$|dump\.request|stacks\.txt|idle-stacks|world\.json|"
        r"job\.json|torchrun\.log|spill\.log|command\.json|root_cause\.json|output\.log"),
    "folders": re.compile(r"^(progress|strays)$"),
    "markers": re.compile(r"^(start|done)$|^\.r$"),
    "store keys and words": re.compile(r"^cpmatrix/|^/ready/|^(go|stop):?$"),
    "statuses": re.compile(r"^(ok|error|recycle)$"),
    # --profile is a run option carried in the world file, not read from the environment.
    "environment": re.compile(r"CPMATRIX_PROFILE"),
}
#: Literals that are not the protocol's, with the reason.
NOT_PROTOCOL = {
    # discover_main's own output: a case that cannot be imported ({"error": ...}).
    ("discover_main.py", "error"),
}


def _not_spellings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (prose) and of ``__all__``'s (names)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            found.update(id(c) for c in ast.walk(node.value))
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value,
                                                                     ast.Constant):
                found.add(id(body[0].value))
    return found


def _literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    skip = _not_spellings(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in skip]


def _sources() -> list[Path]:
    return sorted(p for side in SIDES for p in (side.rglob("*.py") if side.is_dir() else [side])
                  if "protocol" not in p.relative_to(SRC).parts)


def _found(paths: list[Path], root: Path = SRC) -> list[str]:
    """``path:line: 'text' (what)`` for every spelling by hand in ``paths``."""
    return [f"{path.relative_to(root)}:{line}: {text!r} ({what})"
            for path in paths for line, text in _literals(path)
            for what, pattern in SPELLINGS.items()
            if pattern.search(text) and (path.name, text) not in NOT_PROTOCOL]


def test_no_side_spells_the_protocol_by_hand() -> None:
    found = _found(_sources())
    assert found == [], "use cpmatrix.worker.protocol:\n" + "\n".join(found)


def test_the_scan_is_not_vacuous(tmp_path: Path) -> None:
    """Through the scan the test above runs: each kind of spelling it knows is found in a
    hand-written source; prose (a docstring), ``__all__`` and a listed exception are not
    spellings."""
    source = tmp_path / "side.py"
    source.write_text('"""Docstrings may name dump.request and root_cause.json."""\n'
                      '__all__ = ["done"]\n'
                      'a = f"rank{r}.pid"\nb = "progress"\nc = f"cpmatrix/{i}/r{r}"\n'
                      'd = "recycle"\ne = "go"\nf = "done"\ng = "CPMATRIX_PROFILE"\n')
    found = _found([source], root=tmp_path)
    assert {f.rpartition(" (")[2].rstrip(")") for f in found} == set(SPELLINGS), found
    assert not any("dump.request" in f or "root_cause" in f for f in found), found
    assert [f for f in found if "'done'" in f] == ["side.py:8: 'done' (markers)"], found
    excepted = tmp_path / "discover_main.py"
    excepted.write_text('OUT = {"error": 1}\nBAD = "error"\n')
    assert _found([excepted], root=tmp_path) == [], "NOT_PROTOCOL's exception is read"
    assert len(_sources()) > 10  # both sides were read


@pytest.mark.parametrize("module", [protocol, folders, records, store],
                         ids=lambda m: m.__name__)
def test_doctests(module: object) -> None:
    result = doctest.testmod(module)  # type: ignore[arg-type]
    assert result.failed == 0 and result.attempted > 0


def test_records_round_trip_and_refuse_other_runs_and_other_shapes(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    # A cell of each kind's payload: a pytest cell's test, a spill cell's compile spec.
    cells = [CellSpec(id="p", target="t", case="m:f", rows=1, cols=2, dtype="fp64",
                      out_dir="x", pytest=PytestSpec(nodeid="t.py::a", dialect="marker",
                                                     session='{"dir": "/r"}')),
             CellSpec(id="s", target="t", case="m:f", rows=1, cols=1, dtype="fp64",
                      out_dir="y", spill={"kernel": "k.py:add"})]
    world = WorldSpec(name="w", run_id="r1", supervisor_pid=1, dir="d", out_root="o",
                      backend="gloo", device="cpu", platform="cpu", pg_timeout_s=60.0,
                      pythonpath=[], project_roots=[], cells=cells, profile=True)
    write_typed(path, world)
    assert read_typed(path, WorldSpec) == world
    assert isinstance(world.to_json()["cells"][0]["pytest"], dict)  # (plain JSON on disk)
    assert read_typed(path, WorldSpec, run="r1") == world
    assert read_typed(path, WorldSpec, run="r2") is None  # another run's
    assert read_typed(path, RootCause) is None  # not this type's shape
    assert read_typed(tmp_path / "missing.json", WorldSpec) is None
    # A world file written before the profile field reads as not profiled.
    data = world.to_json()
    del data["profile"]
    assert WorldSpec.from_json(data).profile is False
    # A pytest cell whose test is not a mapping with a node id is no cell of this shape.
    for bad in ("t.py::a", {"dialect": "marker"}):
        data["cells"][0]["pytest"] = bad
        with pytest.raises(ValueError, match="PytestSpec"):
            WorldSpec.from_json(data)


def test_store_words_parse_back_and_garbage_is_never_go_or_ok() -> None:
    assert Ready.decode(Ready(go=True, held=-1).encode()) == Ready(go=True, held=-1)
    assert [Ready.decode(v) for v in ("go", "go:x", "maybe:3", "")] == [None] * 4
    # A word that does not parse is a stop: the cell is skipped, never run half-agreed.
    assert SubWorld.decide(["go:3", "garbage"], held=3, held_ranks=(0, 1),
                           ranks=(0, 1)) == "skip"
    report = PeerReport(status="recycle", groups={"groups": {"g": 1}})
    assert PeerReport.decode(report.encode()) == report
    assert PeerReport.decode(b'{"s": "fine", "r": {}}') == PeerReport(status="error")
    assert PeerReport.decode(b"not json").ok is False


def test_a_root_cause_is_read_typed_for_fork_and_parsed_from_text_for_torchrun(
        tmp_path: Path) -> None:
    folder = WorldFolder(tmp_path)
    assert launcher_root_cause("fork", folder, "r1") is None
    # An earlier run's launcher (world names repeat from run to run) names no culprit.
    write_typed(folder.root_cause, RootCause(run="r0", rank=3, exitcode=1, pid=6, time=0.0))
    assert launcher_root_cause("fork", folder, "r1") is None
    write_typed(folder.root_cause, RootCause(run="r1", rank=2, exitcode=-9, pid=7, time=0.0))
    assert launcher_root_cause("fork", folder, "r1") == (2, "killed by signal SIGKILL")
    # torchrun's own text block is its format: read for that launcher only.
    folder.launcher_log.write_text("Root Cause (first observed failure):\n[0]:\n"
                                   "  rank      : 1 (local_rank: 1)\n  exitcode  : 7\n")
    assert launcher_root_cause("torchrun", folder, "r1") == (1, "exited with code 7")
    assert launcher_root_cause("fork", folder, "r1") == (2, "killed by signal SIGKILL")


def test_strays_are_listed_by_pid_for_their_cell_and_rank_only(tmp_path: Path) -> None:
    folder = WorldFolder(tmp_path)
    folder.strays.mkdir()
    for index, rank, pid in ((3, 1, 40), (3, 1, 41), (3, 10, 42), (13, 1, 43)):
        folder.stray(index, rank, pid).write_text("returned")
    assert list(folder.strays_of(3, 1)) == ["40", "41"]
