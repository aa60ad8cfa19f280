"""The rule of repeated runs (``cpmatrix.repeated``), over every combination of run
outcomes, against an oracle written from docs/running.md's table; the combined result
(``combine_runs``); the gate re-applying the rule; the table in the docs."""

from __future__ import annotations

import doctest
import itertools
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cpmatrix import repeated
from cpmatrix.gate import Policy
from cpmatrix.gate._checks import Reason, check_status
from cpmatrix.repeated import RUN_CLASS, parse_run_statuses, repeated_status, rule_index
from cpmatrix.report import ReportCell
from cpmatrix.result import FailureKind, Result, Status
from cpmatrix.supervise.policies import combine_runs

DOCS = Path(__file__).resolve().parents[2] / "docs"
RUN_STATUSES = list(RUN_CLASS)
FAILS = {Status.FAILED, Status.CRASH, Status.TIMEOUT}
PASSES = {Status.PASSED, Status.CACHED}
NO_VERDICT = {Status.INTERRUPTED, Status.INFRA}


def oracle(runs: list[Status]) -> Status:
    """docs/running.md's table, written again without the module's classes."""
    failed = [s for s in runs if s in FAILS or s is Status.FLAKY]
    passed = [s for s in runs if s in PASSES or s is Status.FLAKY]
    if failed and passed:
        return Status.FLAKY
    if failed:
        return failed[0]
    if any(s in NO_VERDICT for s in runs):
        return next(s for s in runs if s in NO_VERDICT)
    if Status.SKIPPED in runs:
        return Status.SKIPPED
    return Status.PASSED


def test_doctests_run() -> None:
    result = doctest.testmod(repeated)
    assert result.failed == 0 and result.attempted >= 5


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_combination_of_up_to_four_runs_follows_the_table(n: int) -> None:
    for runs in itertools.product(RUN_STATUSES, repeat=n):
        assert repeated_status(runs) is oracle(list(runs)), runs


@given(st.lists(st.sampled_from(RUN_STATUSES), min_size=1, max_size=12))
def test_a_failed_run_is_never_hidden(runs: list[Status]) -> None:
    status = repeated_status(runs)
    assert status is oracle(runs)
    if any(s in FAILS for s in runs):
        assert status is Status.FLAKY or status in FAILS
        assert not status.ok and status is not Status.SKIPPED
    if any(s in FAILS for s in runs) and any(s in PASSES for s in runs):
        assert status is Status.FLAKY
    assert (status is Status.PASSED) == all(s in PASSES for s in runs)
    assert (status is Status.SKIPPED) == (
        Status.SKIPPED in runs and all(s in PASSES | {Status.SKIPPED} for s in runs))
    # The order of the runs changes only which run of the deciding class is named.
    shuffled = list(reversed(runs))
    assert RUN_CLASS.get(repeated_status(shuffled)) is RUN_CLASS.get(status)


@given(st.lists(st.sampled_from(RUN_STATUSES), min_size=1, max_size=8))
def test_the_combined_result_carries_the_rule_and_every_run(runs: list[Status]) -> None:
    results = [Result(cell_id="c", status=s, message=f"m{i}", duration_s=float(i),
                      kind=FailureKind.ERROR if s in FAILS else None)
               for i, s in enumerate(runs)]
    r = combine_runs(results)
    assert r.status is repeated_status(runs)
    assert r.run_statuses == tuple(runs) and r.runs == len(runs)
    assert r.runs_passed == runs.count(Status.PASSED)
    assert len(r.run_failures) == len(runs) - runs.count(Status.PASSED)
    assert Result.from_dict(r.to_dict()) == r
    if r.status in FAILS or r.status is Status.FLAKY:  # the first failing run's story
        first = next(x for x in results if x.status in FAILS | {Status.FLAKY})
        assert r.kind is first.kind


@pytest.mark.parametrize(("runs", "row"), [
    ([Status.PASSED, Status.FAILED], 1), ([Status.FLAKY], 1),
    ([Status.SKIPPED, Status.FAILED, Status.FAILED], 2),
    ([Status.PASSED, Status.INFRA], 3), ([Status.SKIPPED, Status.PASSED], 4),
    ([Status.CACHED, Status.PASSED], 5)])
def test_rule_index_names_the_deciding_row(runs: list[Status], row: int) -> None:
    assert rule_index(runs) == row


def test_no_runs_and_mutant_statuses_are_refused() -> None:
    with pytest.raises(ValueError) as empty:
        repeated_status([])
    assert str(empty.value) == "a repeated cell has at least one run"
    with pytest.raises(ValueError) as mutant:
        repeated_status([Status.PASSED, Status.KILLED, Status.SURVIVED])
    assert str(mutant.value) == (
        "not a status a repeated run can end with: killed, survived (allowed: passed, "
        "cached, failed, crash, timeout, flaky, interrupted, infra, skipped)")
    with pytest.raises(ValueError) as bad:
        parse_run_statuses("passed, nope")
    assert str(bad.value) == "run_statuses: 'nope' is not a status"


def test_the_reproducer_messages() -> None:
    skip = Result(cell_id="c", status=Status.SKIPPED, message="not run: -x")
    bad = Result(cell_id="c", status=Status.FAILED, message="boom", kind=FailureKind.ERROR)
    r = combine_runs([skip, bad, bad])
    assert r.status is Status.FAILED and r.kind is FailureKind.ERROR
    assert r.message.startswith("failed 2 of 3 runs (0/3 runs passed): run 1: skipped")
    ok = Result(cell_id="c", status=Status.PASSED)
    assert combine_runs([skip, ok]).message == "not run: -x (1/2 runs passed, 1 skipped)"


# --------------------------------------------------------------------------------------
# the gate re-applies the rule

LENIENT = Policy(name="lenient", allow_flaky=True, allow_skipped=True)
CELL = "t[unit,1x1,fp64,autocast=off,reference]@cpu"


def _cell(status: Status, **props: str) -> ReportCell:
    return ReportCell(name=CELL, status=status, properties={"runs": "3", **props})


def test_the_gate_fails_a_skipped_cell_whose_runs_failed_even_when_skips_are_allowed() -> None:
    c = _cell(Status.SKIPPED, run_statuses="skipped,failed,failed")
    assert check_status(LENIENT, [c]) == [Reason("status", CELL, (
        "skipped, but its runs (skipped,failed,failed) make it failed (the rule of "
        "repeated runs)"))]


@given(st.lists(st.sampled_from(RUN_STATUSES), min_size=1, max_size=6),
       st.sampled_from(RUN_STATUSES))
def test_the_gate_accepts_only_the_status_the_rule_gives(runs: list[Status],
                                                         said: Status) -> None:
    c = _cell(said, run_statuses=",".join(s.value for s in runs))
    reasons = check_status(LENIENT, [c])
    if said is not repeated_status(runs):
        assert [r.check for r in reasons] == ["status"]
    elif said.ok or said in (Status.SKIPPED, Status.FLAKY):
        assert reasons == []


@pytest.mark.parametrize("status", [Status.SKIPPED, Status.FLAKY])
def test_a_repeated_cell_without_run_statuses_is_never_allowed_as_skipped_or_flaky(
        status: Status) -> None:
    (reason,) = check_status(LENIENT, [_cell(status)])
    assert reason == Reason("status", CELL, (
        f"{status.value} over 3 runs whose statuses the report does not record (rerun "
        "with this cpmatrix)"))
    assert check_status(LENIENT, [_cell(Status.PASSED)]) == []


def test_every_cell_is_judged_after_one_whose_runs_disagree() -> None:
    other = ReportCell(name="u", status=Status.FAILED, properties={})
    reasons = check_status(LENIENT, [_cell(Status.SKIPPED, run_statuses="failed"), other])
    assert [(r.check, r.cell) for r in reasons] == [("status", CELL), ("status", "u")]


def test_unreadable_run_statuses_fail_the_cell() -> None:
    (reason,) = check_status(LENIENT, [_cell(Status.SKIPPED, run_statuses="skipped,bad")])
    assert "unreadable" in reason.detail and "'bad'" in reason.detail


# --------------------------------------------------------------------------------------
# the docs' table is the rule

def test_the_docs_table_is_the_rule() -> None:
    text = (DOCS / "running.md").read_text()
    rows = re.findall(r"^  \| (\d) \| .* \| ([a-z, ]+) -> (\w+) \|$", text, re.MULTILINE)
    assert [int(n) for n, _, _ in rows] == [1, 2, 3, 4, 5]
    for n, runs, cell in rows:
        statuses = [Status(w.strip()) for w in runs.split(",")]
        assert repeated_status(statuses).value == cell
        assert rule_index(statuses) == int(n)
