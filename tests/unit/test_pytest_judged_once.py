"""A pytest cell's verdict is judged once and handed on, as pytest-xdist replays reports.

The job judges the result it makes from the ranks' files
(:func:`cpmatrix.kinds.pytest.records.judged_cell`); the pytest front replays that
judgement (:func:`~cpmatrix.kinds.pytest.records.judgement`) and judges only a result
no job judged (one the run composed later: a crash that passed when retried). A source
scan keeps the judging in one place: a second call of the judge anywhere fails it.
"""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

from cpmatrix.kinds.pytest.records import REPORTS_FILE, Judged, judged_cell, judgement
from cpmatrix.layout import rank_dir
from cpmatrix.result import FailureKind, RankFailure, Result, Status

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "cpmatrix"
NODEID = "test_x.py::test_y"


#: The modules whose names the scan follows (other modules have judges of their own).
VERDICT_MODULES = ("cpmatrix.kinds.pytest.verdict", "cpmatrix.kinds.pytest.records")


def _imports_verdict(tree: ast.Module, path: Path) -> bool:
    if path.relative_to(PACKAGE).as_posix() in ("kinds/pytest/verdict.py",
                                                 "kinds/pytest/records.py"):
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in VERDICT_MODULES:
            return True
        if isinstance(node, ast.Import) and any(a.name in VERDICT_MODULES
                                                for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "cpmatrix.matrix" and any(
                a.name in ("pytest_verdict", "pytest_records") for a in node.names):
            return True
    return False


def _calls(name: str) -> list[str]:
    """``module:function`` of every call of ``name`` (a bare name or an attribute) in
    the package's modules that import the verdict's."""
    found: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        if not _imports_verdict(tree, path):
            continue
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                called = f.id if isinstance(f, ast.Name) else (
                    f.attr if isinstance(f, ast.Attribute) else "")
                if called == name:
                    found.append(f"{path.relative_to(PACKAGE)}:{fn.name}")
    return sorted(set(found))


def test_the_verdict_is_judged_in_one_place() -> None:
    # The judge over the ranks' phases, the records read back and the result rewritten:
    # each in one function, and the front reaches them only through `judgement`.
    assert _calls("judge") == ["kinds/pytest/records.py:judgement"]
    assert _calls("phases_of") == ["kinds/pytest/records.py:judgement"]
    assert _calls("judged_result") == ["kinds/pytest/records.py:judged_cell"]
    assert _calls("judged_cell") == ["kinds/pytest/executor.py:_judged"]
    assert _calls("judgement") == ["kinds/pytest/controller.py:_on_result",
                                   "kinds/pytest/records.py:judged_cell"]


def _write(cell_dir: Path, call: dict[int, str]) -> None:
    """Each rank's ``pytest.json``: setup passed, ``call[rank]``, teardown passed."""
    for rank, outcome in call.items():
        phases = [{"when": w, "outcome": o, "kind": o, "summary": s, "text": s, "index": i}
                  for i, (w, o, s) in enumerate([("setup", "passed", ""),
                                                 ("call", outcome, f"{outcome} on {rank}"),
                                                 ("teardown", "passed", "")])]
        folder = rank_dir(cell_dir, rank)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / REPORTS_FILE).write_text(json.dumps({"nodeid": NODEID, "phases": phases}))


def _gone(cell_dir: Path) -> None:
    for f in cell_dir.rglob(REPORTS_FILE):
        f.unlink()


def test_the_front_replays_the_jobs_judgement(tmp_path: Path) -> None:
    _write(tmp_path, {0: "failed", 1: "passed"})
    world = Result(cell_id="c", status=Status.PASSED)
    judged = judged_cell(tmp_path, 2, world, NODEID)
    assert judged.status is Status.FAILED
    assert isinstance(judged.judged, Judged)
    assert judged.judged.verdict.outcome == "failed"
    _gone(tmp_path)  # judged again, the files would now say "no rank reported"
    # What the run adds on the way (the working folder's note, provenance, the repro
    # command) is the same result: the front replays its judgement, the same object.
    on_the_way = replace(judged, message=f"{judged.message}; working folder kept: w",
                         source={"digest": "d"}, repro="cpmatrix repro c")
    assert judgement(tmp_path, 2, on_the_way, NODEID) is judged.judged
    assert judged.to_dict() == replace(judged, judged=None).to_dict()  # never written


def test_a_result_no_job_judged_is_judged_by_the_front(tmp_path: Path) -> None:
    _write(tmp_path, {0: "passed", 1: "passed"})
    dead = RankFailure(rank=1, message="rank 1 died during the cell (killed by SIGKILL)")
    crash = judged_cell(tmp_path, 2, Result(
        cell_id="c", status=Status.CRASH, kind=FailureKind.CRASH, failing_ranks=(1,),
        failures=(dead,), message="a rank died"), NODEID)
    # The crash retried alone passed: the run makes a FLAKY result of the first one.
    flaky = replace(crash, status=Status.FLAKY, attempts=2, message="passed when retried")
    found = judgement(tmp_path, 2, flaky, NODEID)
    assert found is not crash.judged
    assert (found.verdict.outcome, found.verdict.reason) == ("failed",
                                                             "flaky: passed when retried")
    # ... and so is a cached pass read back from the store (nothing handed on).
    cached = Result.from_dict({**judged_cell(tmp_path, 2, Result(
        cell_id="c", status=Status.PASSED), NODEID).to_dict(), "status": "cached"})
    assert cached.judged is None
    assert judgement(tmp_path, 2, cached, NODEID).verdict.outcome == "passed"


def test_a_crash_is_judged_with_its_kept_folder_named(tmp_path: Path) -> None:
    """The job judges a crash or hang once its working folder is named in the world's
    message (the verdict quotes that message): the replayed verdict names the folder."""
    from cpmatrix.kinds.pytest.executor import PytestWorldRun
    from cpmatrix.layout import work_folder
    from cpmatrix.matrix.schema import Cell, Mesh, Platform
    from cpmatrix.supervise.context import RunContext
    from cpmatrix.supervise.entry import Entry
    from cpmatrix.supervise.runners import get_runner

    cell = Cell(id="pytest[unit,1x2]@cpu", target="pytest", case="m:f", kind="pytest",
                level="unit", mesh=Mesh.parse("1x2"), dtype="fp64", autocast=False,
                path="reference", params=(), platform="cpu", timeout_s=60, tags=(),
                pytest=json.dumps({"nodeid": NODEID}))
    entry = Entry(cell=cell)
    world = PytestWorldRun("000-w", [entry], Platform(name="cpu", backend="gloo",
                                                      device="cpu"),
                           RunContext(out_root=tmp_path, runner=get_runner("local")))
    (tmp_path / work_folder(entry.out_dir, world.name)).mkdir(parents=True)
    _write(tmp_path / entry.out_dir, {0: "passed"})  # rank 1 died before it wrote
    dead = RankFailure(rank=1, message="rank 1 died during the cell (killed by SIGKILL)")
    crash = world._with_folder(entry, Result(
        cell_id=cell.id, status=Status.CRASH, kind=FailureKind.CRASH, failing_ranks=(1,),
        failures=(dead,), message="a rank died"))
    assert crash.status is Status.CRASH and "working folder kept: " in crash.message
    assert isinstance(crash.judged, Judged)
    made = [p.message for p in crash.judged.verdict.phases if p.outcome == "failed"]
    assert made and "working folder kept: " in made[0]
    assert judgement(tmp_path / entry.out_dir, 2, crash, NODEID) is crash.judged
