"""The pure parts of runs per test and the flake history: one verdict from N runs
(``combine_runs``) and the per-cell history of ``durations.json``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpmatrix.report.history import (
    KEEP,
    CellHistory,
    RunRecord,
    history_json,
    merge_histories,
    parse_histories,
    read_histories,
    with_runs,
)
from cpmatrix.result import FailureKind, Result, Status
from cpmatrix.supervise.policies import combine_runs

C = "t[unit,1x1,fp64,autocast=off,reference]@cpu"


def _r(status: Status, message: str = "", kind: FailureKind | None = None,
       duration: float = 1.0) -> Result:
    return Result(cell_id=C, status=status, message=message, kind=kind, duration_s=duration)


OK = _r(Status.PASSED)
BAD = _r(Status.FAILED, "boom", FailureKind.ERROR)
SLOW = _r(Status.TIMEOUT, "hung", FailureKind.TIMEOUT)
RETRIED = _r(Status.FLAKY, "passed when retried alone", FailureKind.CRASH)
STOPPED = _r(Status.INTERRUPTED, "interrupted")


@pytest.mark.parametrize(("runs", "status", "passed"), [
    ([OK, OK, OK], Status.PASSED, 3),
    ([OK, BAD, OK], Status.FLAKY, 2),
    ([BAD, OK], Status.FLAKY, 1),
    ([SLOW, BAD, SLOW], Status.TIMEOUT, 0),  # failed every run: the first failure's status
    ([OK, RETRIED, OK], Status.FLAKY, 2),  # a run that needed a retry is not a pass
    ([RETRIED, RETRIED], Status.FLAKY, 0),
    ([OK, STOPPED, OK], Status.INTERRUPTED, 2),  # incomplete: never a pass
    ([BAD, STOPPED], Status.FAILED, 0),  # a failure is never hidden
    ([OK, STOPPED, BAD], Status.FLAKY, 1),  # they already disagree
], ids=["all-pass", "one-fails", "first-fails", "all-fail", "retried", "only-retried",
        "stopped", "stopped-failing", "stopped-flaky"])
def test_combine_runs(runs: list[Result], status: Status, passed: int) -> None:
    r = combine_runs(runs)
    assert (r.status, r.runs, r.runs_passed) == (status, len(runs), passed)
    assert len(r.run_failures) == len(runs) - passed
    assert r.status.ok == (status is Status.PASSED)


def test_combined_failure_keeps_each_run_and_the_mean_duration() -> None:
    r = combine_runs([OK, _r(Status.FAILED, "boom", FailureKind.ERROR, 3.0)])
    assert r.run_failures == ("run 2: failed (error) on rank ?: boom",)
    assert r.kind is FailureKind.ERROR and r.duration_s == 2.0
    assert r.message == "flaky: 1/2 runs passed; run 2: failed (error) on rank ?: boom"
    assert Result.from_dict(r.to_dict()) == r
    assert "runs" not in OK.to_dict()  # a plain run's row is unchanged


def test_history_records_runs_with_a_verdict_only() -> None:
    h = with_runs({}, [OK, BAD, RETRIED, STOPPED, _r(Status.CACHED), _r(Status.SKIPPED),
                       Result(cell_id=C, status=Status.FAILED, mutant="bug")], at=7.0)
    assert [r.outcome for r in h[C].runs] == ["passed", "failed", "flaky"]
    assert h[C].passed == 1 and h[C].failed == 2 and h[C].flipped
    assert h[C].flake_rate == pytest.approx(2 / 3)
    assert not with_runs({}, [BAD, BAD], at=1.0)[C].flipped
    assert with_runs({}, [BAD, BAD], at=1.0)[C].flake_rate == 0.0


def test_history_keeps_the_last_runs() -> None:
    h = with_runs({}, [OK] * (KEEP + 5), at=1.0)
    h = with_runs(h, [BAD], at=2.0)
    assert len(h[C].runs) == KEEP and h[C].runs[-1].outcome == "failed"
    assert h[C].duration_s == 1.0  # the last passing run's


def test_history_file_round_trip_and_old_form(tmp_path: Path) -> None:
    h = with_runs({"old": CellHistory(duration_s=2.0)}, [OK, BAD], at=3.0)
    path = tmp_path / "durations.json"
    path.write_text(json.dumps(history_json(h)))
    assert read_histories(path) == h
    path.write_text(json.dumps({C: 1.5}))
    assert read_histories(path) == {C: CellHistory(duration_s=1.5)}


@pytest.mark.parametrize(("data", "message"), [
    ([], "f.json: expected a mapping of cell id to history, got list"),
    ({C: "fast"}, f"f.json: {C}: expected a number of seconds, got 'fast'"),
    ({C: {"runs": {}}}, f"f.json: {C}: runs must be a list, got dict"),
    ({C: {"runs": [{"at": 1.0}]}}, f"f.json: {C}: runs[0] must be a mapping with at, outcome"),
    ({C: {"runs": [{"at": None, "outcome": "passed", "duration_s": 1}]}},
     f"f.json: {C}: runs[0].at: expected a number of seconds, got None"),
    ({C: {"seconds": 1}}, f"f.json: {C}: unknown keys ['seconds']"),
], ids=["list", "string", "runs-dict", "no-outcome", "no-time", "unknown-key"])
def test_damaged_history_names_what_is_wrong(data: object, message: str) -> None:
    with pytest.raises(ValueError) as exc:
        parse_histories(data, "f.json")
    assert str(exc.value).startswith(message), exc.value


def test_merge_is_a_multiset_union() -> None:
    base = with_runs({}, [OK, BAD], at=1.0)
    one = with_runs(base, [OK], at=2.0)  # shard 1: the baseline and a pass
    two = with_runs(base, [BAD, BAD], at=3.0)  # shard 2: the baseline and two like failures
    merged = merge_histories([one, two])
    assert [(r.at, r.outcome) for r in merged[C].runs] == [
        (1.0, "passed"), (1.0, "failed"), (2.0, "passed"), (3.0, "failed"), (3.0, "failed")]
    assert merge_histories([two, two]) == two
    assert merge_histories([{C: CellHistory(duration_s=5.0)}, {C: CellHistory()}])[C] == \
        CellHistory(duration_s=5.0)
    many = merge_histories([with_runs({}, [OK] * KEEP, at=1.0), with_runs({}, [BAD], at=9.0)])
    assert len(many[C].runs) == KEEP and many[C].runs[-1] == RunRecord(9.0, "failed", 1.0)


def test_merge_keeps_the_order_of_runs_recorded_at_one_time() -> None:
    # The runs of one --runs-per-test run share their time; two alike (same outcome,
    # same seconds) must not be pulled together past the failure between them.
    one_run = with_runs({}, [OK, BAD, OK], at=1.0)
    assert [r.outcome for r in one_run[C].runs] == ["passed", "failed", "passed"]
    assert merge_histories([one_run, one_run]) == one_run
    assert merge_histories([{}, one_run, one_run]) == one_run
    later = with_runs({}, [BAD], at=2.0)
    assert [r.outcome for r in merge_histories([later, one_run])[C].runs] == [
        "passed", "failed", "passed", "failed"]
