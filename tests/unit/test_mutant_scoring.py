"""Honest mutant scores (issue 22, finding 7): a mutant is judged only against its
unmutated cell's result in the same run; KILLED / SURVIVED / NOT JUDGED everywhere a
mutant run is shown (the session, the CLI's lines, JUnit, results.json, the gate)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cpmatrix.cli.console import format_summary
from cpmatrix.gate._checks import check_mutants
from cpmatrix.gate._policy import Policy
from cpmatrix.matrix.schema import Cell, Mesh
from cpmatrix.report.junit import results_to_junit, write_junit
from cpmatrix.report.read import read_report
from cpmatrix.result import FailureKind, RankFailure, Result, Status
from cpmatrix.supervise.entry import Entry
from cpmatrix.supervise.policies import interpret_mutant
from cpmatrix.supervise.run_report import RunReport
from cpmatrix.supervise.session import JobPool, _Session

CELL = "t[unit,1x2,fp64,autocast=off,reference]@cpu"
PASSED = Result(cell_id=CELL, status=Status.PASSED)
FAILED = Result(cell_id=CELL, status=Status.FAILED, kind=FailureKind.ERROR, failing_ranks=(0, 1),
                failures=(RankFailure(rank=0, message="MismatchError: parity: output",
                                      check="output"),))


def _mutant(result: Result, name: str = "bug") -> Result:
    return replace(result, mutant=name)


def test_a_failure_with_the_bug_planted_in_a_passing_cell_is_killed() -> None:
    out = interpret_mutant(_mutant(FAILED), PASSED)
    assert out.status is Status.KILLED and out.status.ok
    assert out.evidence == {"mutant_outcome": "killed", "killed_by": "output"}
    assert out.message.startswith("mutant 'bug' killed by output: failed (error) on rank 0,1")
    assert out.failing_ranks == (0, 1)  # where the bug showed: evidence, not a failure


def test_a_pass_with_the_bug_planted_survives() -> None:
    out = interpret_mutant(_mutant(PASSED), PASSED)
    assert out.status is Status.SURVIVED and not out.status.ok
    assert out.evidence["mutant_outcome"] == "survived"
    assert "survived: the cell passed with this bug planted" in out.message


@pytest.mark.parametrize("base", [
    FAILED, replace(PASSED, status=Status.FLAKY), replace(PASSED, status=Status.CRASH),
    replace(PASSED, status=Status.INTERRUPTED), None,
])
def test_a_mutant_of_a_cell_that_did_not_pass_is_not_judged(base: Result | None) -> None:
    for run in (_mutant(FAILED), _mutant(PASSED)):
        out = interpret_mutant(run, base)
        assert out.status is Status.NOT_JUDGED and not out.status.ok
        assert out.evidence["mutant_outcome"] == "not_judged"
        assert "not judged: its unmutated cell" in out.message
        assert "proves nothing" in out.message


def test_a_mutant_run_that_could_not_start_is_not_judged() -> None:
    run = _mutant(replace(FAILED, message="could not start the world: no gloo"))
    out = interpret_mutant(run, PASSED)
    assert out.status is Status.NOT_JUDGED
    assert out.message == "mutant 'bug' not judged: could not start the world: no gloo"


def test_statuses_are_written_as_the_cli_says_them() -> None:
    assert [s.label for s in (Status.KILLED, Status.SURVIVED, Status.NOT_JUDGED)] == [
        "KILLED", "SURVIVED", "NOT JUDGED"]


# --------------------------------------------------------------------------------------
# the session: a mutant that finishes first waits for its unmutated cell


def _cell() -> Cell:
    return Cell(id=CELL, target="t", case="m:f", kind="parity", level="unit",
                mesh=Mesh.parse("1x2"), dtype="fp64", autocast=False, path="reference",
                params=(), platform="cpu", timeout_s=60, tags=())


def _session() -> Any:
    session = _Session(SimpleNamespace(sources={}, repro=None), {}, pool=JobPool(), store=None,
                       on_result=None)
    cell = _cell()
    session.planned = [Entry(cell=cell), Entry(cell=cell, mutant="bug"),
                       Entry(cell=cell, mutant="other")]
    return session, cell


def _item(batch: str = "w0") -> Any:
    return SimpleNamespace(batch=batch, executor=SimpleNamespace(retries_crashes=False))


def test_a_mutant_finished_before_its_cell_is_judged_once_the_cell_is() -> None:
    session, cell = _session()
    base_id = cell.id
    session.finish(_item(), Entry(cell=cell, mutant="bug"),
                   replace(FAILED, cell_id=base_id, mutant="bug"))
    assert list(session.results) == []  # waiting: nothing judged yet
    session.finish(_item(), Entry(cell=cell), replace(PASSED, cell_id=base_id))
    assert session.results[f"{base_id}!mutant=bug"].status is Status.KILLED
    session.finish(_item(), Entry(cell=cell, mutant="other"),
                   replace(PASSED, cell_id=base_id, mutant="other"))
    assert session.results[f"{base_id}!mutant=other"].status is Status.SURVIVED


def test_mutants_of_a_failing_cell_are_not_judged_whatever_they_did() -> None:
    session, cell = _session()
    session.finish(_item(), Entry(cell=cell), replace(FAILED, cell_id=cell.id))
    session.finish(_item(), Entry(cell=cell, mutant="bug"),
                   replace(FAILED, cell_id=cell.id, mutant="bug"))
    assert session.results[f"{cell.id}!mutant=bug"].status is Status.NOT_JUDGED


def test_a_mutant_whose_cell_never_finished_is_not_judged_when_the_run_closes() -> None:
    session, cell = _session()
    session.finish(_item(), Entry(cell=cell, mutant="bug"),
                   replace(FAILED, cell_id=cell.id, mutant="bug"))
    session.close_unfinished(stopped_by=2, internal=None)
    assert session.results[cell.id].status is Status.INTERRUPTED
    assert session.results[f"{cell.id}!mutant=bug"].status is Status.NOT_JUDGED
    assert session.results[f"{cell.id}!mutant=other"].status is Status.INTERRUPTED
    assert len(session.results) == 3  # every planned entry ends as exactly one result


def test_the_kill_rate_leaves_out_what_was_not_judged_and_says_so() -> None:
    runs = {
        "a": replace(PASSED, cell_id="a"),
        "a!mutant=x": replace(PASSED, cell_id="a", mutant="x", status=Status.KILLED),
        "a!mutant=y": replace(PASSED, cell_id="a", mutant="y", status=Status.SURVIVED),
        "b": replace(FAILED, cell_id="b"),
        "b!mutant=z": replace(PASSED, cell_id="b", mutant="z", status=Status.NOT_JUDGED),
    }
    report = RunReport(results=runs, wall_s=1.0, report_path=Path("r.xml"))
    line = report.mutant_line()
    assert line.splitlines()[0] == ("mutants: 1/2 killed (kill rate 50.0%); 1 not judged (left "
                                    "out of the kill rate: their unmutated cell did not pass "
                                    "in this run)")
    assert "survived (vacuous for these bugs):\n  a!mutant=y" in line
    assert "not judged (fix the cell first):\n  b!mutant=z" in line
    summary = format_summary(report, "out")
    assert "SURVIVED a!mutant=y" in summary and "NOT JUDGED b!mutant=z" in summary
    assert "PASSED" not in summary and "1 killed" in summary


# --------------------------------------------------------------------------------------
# JUnit and results.json say it too, and the gate reads it back


def test_junit_round_trips_the_mutant_statuses(tmp_path: Path) -> None:
    cell = _cell()
    results = [
        replace(PASSED, cell_id=cell.id),
        interpret_mutant(replace(FAILED, cell_id=cell.id, mutant="k"), PASSED),
        interpret_mutant(replace(PASSED, cell_id=cell.id, mutant="s"), PASSED),
        interpret_mutant(replace(FAILED, cell_id=cell.id, mutant="n"), FAILED),
    ]
    path = tmp_path / "report.xml"
    write_junit(path, results_to_junit(results, {cell.id: cell}))
    text = path.read_text()
    assert 'name="status" value="killed"' in text and 'value="passed"' in text
    by_name = {c.mutant: c for c in read_report(path)}
    assert [by_name[m].status for m in ("", "k", "s", "n")] == [
        Status.PASSED, Status.KILLED, Status.SURVIVED, Status.NOT_JUDGED]
    assert "not judged" in by_name["n"].headline
    assert all(Result.from_dict(r.to_dict()) == r for r in results)  # results.json


def _report_cell(name: str, status: Status, outcome: str) -> Any:
    from cpmatrix.report.read import ReportCell
    return ReportCell(name=f"t@cpu!mutant={name}", status=status,
                      properties={"evidence.mutant_outcome": outcome})


def test_the_gate_leaves_mutants_not_judged_out_of_the_kill_rate() -> None:
    policy = Policy(name="p", min_kill_rate=1.0)
    killed = _report_cell("a", Status.KILLED, "killed")
    unjudged = _report_cell("b", Status.NOT_JUDGED, "not_judged")
    assert check_mutants(policy, [killed, unjudged]) == []
    survived = _report_cell("c", Status.SURVIVED, "survived")
    reasons = check_mutants(policy, [killed, unjudged, survived])
    assert reasons[0].detail.startswith("kill rate 1/2 = 50.0%")
