"""The gate's checks one by one (``cpmatrix.gate._checks``), on cells built in code: each
check's verdict and the exact row a release manager reads. ``test_gate.py`` drives the same
checks through report files and the command."""

from __future__ import annotations

import doctest

import pytest

from cpmatrix.gate import Policy
from cpmatrix.gate import _checks as checks
from cpmatrix.gate._checks import (
    Reason,
    check_drift,
    check_mutants,
    check_spill,
    check_stale,
    check_status,
    evaluate,
    max_errors,
)
from cpmatrix.report import ReportCell
from cpmatrix.result import Status

CELL = "t[unit,1x2,fp64,autocast=off,reference]@cpu"


def cell(name: str = CELL, status: Status = Status.PASSED, text: str = "", headline: str = "",
         **props: str) -> ReportCell:
    """A report cell; ``ev_<key>="v"`` becomes ``evidence.<key>`` (``__`` stands for ``@``)."""
    properties = {(f"evidence.{k[3:]}" if k.startswith("ev_") else k).replace("__", "@"): v
                  for k, v in props.items()}
    return ReportCell(name=name, status=status, properties=properties, text=text,
                      headline=headline)


def test_doctests_run() -> None:
    result = doctest.testmod(checks, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted >= 4


# --------------------------------------------------------------------------------------
# status


STRICT = Policy(name="strict")
LENIENT = Policy(name="lenient", allow_flaky=True, allow_skipped=True)


@pytest.mark.parametrize("status", [Status.PASSED, Status.CACHED])
def test_passed_and_cached_cells_give_no_reason(status: Status) -> None:
    assert check_status(STRICT, [cell(status=status, text="anything")]) == []


@pytest.mark.parametrize(
    ("given", "detail"),
    [
        (cell(status=Status.FLAKY, attempts="3", text="\n  first line \nsecond"),
         "passed only after 3 attempts: first line"),
        (cell(status=Status.FLAKY), "passed only after ? attempts:"),
        (cell(status=Status.SKIPPED, headline="no GPU"), "no GPU"),
        (cell(status=Status.SKIPPED), "skipped"),
    ],
)
def test_flaky_and_skipped_fail_unless_the_policy_allows_them(given: ReportCell,
                                                              detail: str) -> None:
    assert check_status(STRICT, [given]) == [Reason(given.status.value, CELL, detail)]
    assert check_status(LENIENT, [given]) == []


@pytest.mark.parametrize(
    ("given", "detail"),
    [
        # the run's own one-liner wins
        (cell(status=Status.CRASH, headline="crash on rank 1: died", failing_ranks="1",
              text="trace"), "crash on rank 1: died"),
        (cell(status=Status.FAILED, failing_ranks="0,1", text="\n\nAssertionError: x\nmore"),
         "failed on rank 0,1: AssertionError: x"),
        (cell(status=Status.TIMEOUT, text="hung"), "timeout: hung"),
        (cell(status=Status.FAILED), "failed:"),
        # a message property beats the headline and the text
        (cell(status=Status.FAILED, message="the message", text="text"),
         "failed: the message"),
    ],
)
def test_a_failure_row_says_status_ranks_and_first_line(given: ReportCell, detail: str) -> None:
    assert check_status(LENIENT, [given]) == [Reason("status", CELL, detail)]


def test_first_line_prefers_message_then_headline_then_text() -> None:
    flaky = Policy(name="p")
    rows = check_status(flaky, [
        cell(status=Status.FLAKY, message="m", headline="h", text="t"),
        cell(status=Status.FLAKY, headline="h", text="t"),
        cell(status=Status.FLAKY, text="   \n t \n u"),
    ])
    assert [r.detail.split(": ", 1)[1] for r in rows] == ["m", "h", "t"]


def test_details_are_clipped_to_one_line_of_110_characters() -> None:
    exact = "x" * 110
    assert check_status(LENIENT, [cell(status=Status.FAILED, headline=exact)])[0].detail == exact
    long = "word  \n " + "y" * 200
    (row,) = check_status(LENIENT, [cell(status=Status.FAILED, headline=long)])
    assert row.detail == ("word " + "y" * 200)[:107] + "..." and len(row.detail) == 110


# --------------------------------------------------------------------------------------
# spill


def test_spill_row_names_stores_loads_budget_and_registers() -> None:
    rows = check_spill([
        cell(ev_spill_store_bytes="1"),  # no budget recorded: the budget is 0
        cell(name="b", ev_spill_load_bytes="96", ev_budget_bytes="64", ev_registers="255"),
        cell(name="ok", ev_spill_store_bytes="64", ev_budget_bytes="64"),
    ])
    assert rows == [
        Reason("spill", CELL, "spill stores 1 B, loads - B > budget 0 B"),
        Reason("spill", "b", "spill stores - B, loads 96 B > budget 64 B (255 registers)"),
    ]


def test_an_unreadable_budget_fails_the_cell() -> None:
    (row,) = check_spill([cell(ev_spill_store_bytes="0", ev_budget_bytes="lots")])
    assert row.detail == "spill stores 0 B, loads - B > budget nan B"


# --------------------------------------------------------------------------------------
# mutants


def _run(name: str, outcome: str | None, status: Status = Status.PASSED, **props: str
         ) -> ReportCell:
    extra = {"ev_mutant_outcome": outcome} if outcome is not None else {}
    return cell(name=f"{CELL}!mutant={name}", status=status, **extra, **props)


def test_a_low_kill_rate_names_the_rate_and_every_survivor() -> None:
    runs = [_run("a", "killed"), _run("b", "survived", message="the tests passed"),
            _run("c", None, status=Status.CRASH)]
    rows = check_mutants(Policy(name="p", min_kill_rate=0.5), runs)
    assert rows == [
        Reason("mutants", "(3 mutant runs)", "kill rate 1/3 = 33.3% < 50%"),
        Reason("mutants", f"{CELL}!mutant=b", "the tests passed"),
        Reason("mutants", f"{CELL}!mutant=c", "crash"),  # no outcome, no text: the status
    ]
    (_, survivor) = check_mutants(Policy(name="p"), runs[:2])
    assert survivor.detail == "the tests passed"
    assert check_mutants(Policy(name="p"), [_run("s", "survived")])[1].detail == "survived"


@pytest.mark.parametrize(("rate", "ok"), [(2 / 3, True), (0.67, False), (0.0, True)])
def test_the_kill_rate_is_a_lower_bound(rate: float, ok: bool) -> None:
    runs = [_run("a", "killed"), _run("b", "killed"), _run("c", "survived")]
    assert (check_mutants(Policy(name="p", min_kill_rate=rate), runs) == []) is ok
    assert check_mutants(Policy(name="p"), []) == []  # no mutant runs: nothing to judge


def test_mutants_not_judged_are_left_out_of_the_kill_rate() -> None:
    # issue 22: a mutant of a cell that did not pass proves nothing, either way
    unjudged = _run("n", "not_judged", status=Status.NOT_JUDGED)
    runs = [_run("a", "killed", status=Status.KILLED), unjudged]
    assert check_mutants(Policy(name="p"), runs) == []
    assert check_mutants(Policy(name="p"), [unjudged]) == []  # nothing judged: no rate
    rows = check_mutants(Policy(name="p"), [*runs, _run("s", "survived", Status.SURVIVED)])
    assert rows[0] == Reason("mutants", "(2 mutant runs)", "kill rate 1/2 = 50.0% < 100%")
    assert [r.cell for r in rows[1:]] == [f"{CELL}!mutant=s"]


# --------------------------------------------------------------------------------------
# drift


def test_max_errors_scans_every_key_and_keeps_the_worst_rank() -> None:
    c = cell(**{"ev_a.note": "text", "ev_a.max_abs": "not a number", "ev_z.other": "1",
                "ev_p.max_abs__rank1": "3e-9", "ev_p.max_abs": "1e-9",
                "ev_q.max_abs": "5e-9", "ev_q.max_abs__rank1": "2e-9",
                "ev_r.max_abs": "1e-9", "ev_r.max_abs__rank2": "nan",
                "ev_r.max_abs__rank3": "7e-9"})
    found = max_errors(c, ["*.max_abs"])
    assert list(found) == ["p.max_abs", "q.max_abs", "r.max_abs"]
    assert found["p.max_abs"] == 3e-9 and found["q.max_abs"] == 5e-9
    assert str(found["r.max_abs"]) == "nan"  # NaN wins over any later number


DRIFT = Policy(name="d", drift_factor=2.0, drift_floor=1e-12)


def test_drift_continues_past_cells_missing_or_failed_in_the_baseline() -> None:
    new = [cell(name="new", ev_max_abs_diff="1.0"), cell(name="failed", ev_max_abs_diff="1.0"),
           cell(name="grew", ev_max_abs_diff="3e-9")]
    baseline = {"failed": cell(name="failed", status=Status.FAILED, ev_max_abs_diff="1e-9"),
                "grew": cell(name="grew", ev_max_abs_diff="1e-9")}
    rows, compared = check_drift(DRIFT, new, baseline)
    assert rows == [Reason("drift", "grew", "max_abs_diff 1e-09 -> 3e-09 (x3 > x2)")]
    assert compared == 1


def test_drift_continues_past_a_key_without_a_baseline_number() -> None:
    # keys are checked in sorted order: "a.max_abs" (NaN in the baseline) comes first
    old = cell(**{"ev_a.max_abs": "nan", "ev_b.max_abs": "1e-9"})
    new = cell(**{"ev_a.max_abs": "1.0", "ev_b.max_abs": "1e-6"})
    rows, compared = check_drift(DRIFT, [new], {CELL: old})
    assert [r.detail for r in rows] == ["b.max_abs 1e-09 -> 1e-06 (x1e+03 > x2)"]
    assert compared == 1


def test_drift_counts_only_cells_with_a_common_key_and_says_when_the_floor_applied() -> None:
    old = {"zero": cell(name="zero", ev_max_abs_diff="0"),
           "at_floor": cell(name="at_floor", ev_max_abs_diff="1e-12"),
           "unrelated": cell(name="unrelated", ev_max_rel_diff="1")}
    new = [cell(name="zero", ev_max_abs_diff="1e-10"),
           cell(name="at_floor", ev_max_abs_diff="1e-10"),
           cell(name="unrelated", ev_max_abs_diff="1")]
    rows, compared = check_drift(DRIFT, new, old)
    assert [(r.cell, r.detail) for r in rows] == [
        ("zero", "max_abs_diff 0 -> 1e-10 (x100 > x2, floor 1e-12)"),
        ("at_floor", "max_abs_diff 1e-12 -> 1e-10 (x100 > x2)"),
    ]
    assert compared == 2


def test_a_nan_error_is_drift_against_any_number() -> None:
    rows, _ = check_drift(DRIFT, [cell(ev_max_abs_diff="nan")], {CELL: cell(ev_max_abs_diff="1")})
    assert [r.detail for r in rows] == ["max_abs_diff 1 -> nan (xnan > x2)"]


# --------------------------------------------------------------------------------------
# stale: a cell run from other sources (issue 21, row 7)

NOW = {"a": "a" * 64, "b": "b" * 64}


def test_a_cell_run_from_the_matrix_sources_is_not_stale() -> None:
    assert check_stale([cell(name="a", **{"source.digest": "a" * 64})], NOW) == []


def test_a_cell_run_from_other_sources_is_stale_with_both_digests() -> None:
    (row,) = check_stale([cell(name="a", **{"source.digest": "c" * 64})], NOW)
    assert (row.check, row.cell) == ("stale", "a")
    assert row.detail == (
        f"ran from other sources: digest {'c' * 12} in the report, {'a' * 12} from the "
        "matrix now (the case, a module it imports, its matrix entry or cpmatrix changed "
        "since): run the cell again")


def test_a_cell_without_a_digest_is_stale() -> None:
    (row,) = check_stale([cell(name="b")], NOW)
    assert (row.check, row.cell) == ("stale", "b")
    assert row.detail == ("no source digest in the report (written by an older cpmatrix, "
                          "or by hand): run the cell again")


def test_stale_skips_cells_the_matrix_does_not_know_and_interrupted_ones() -> None:
    # not in the matrix: the missing check's business; interrupted: nothing ran; and the
    # cells after them are still checked
    rows = check_stale([cell(name="x", **{"source.digest": "c"}),
                        cell(name="a", status=Status.INTERRUPTED), cell(name="b")], NOW)
    assert [r.cell for r in rows] == ["b"]


def test_stale_reads_the_cell_id_of_a_mutant_run() -> None:
    run = cell(name="a!mutant=m", cell_id="a", mutant="m", **{"source.digest": "c" * 64})
    assert [r.cell for r in check_stale([run], NOW)] == ["a!mutant=m"]


def test_evaluate_checks_sources_only_when_given_digests() -> None:
    policy = Policy(name="p")
    cells = [cell(name="a", **{"source.digest": "a" * 64}), cell(name="b", status=Status.FAILED,
                                                               headline="boom"),
             cell(name="z", status=Status.INTERRUPTED)]
    unchecked = evaluate(policy, cells)
    assert unchecked.sources_checked is None
    assert [r.check for r in unchecked.reasons] == ["status", "status"]
    checked = evaluate(policy, cells, digests={**NOW, "z": "z"})
    # stale comes before status: a result from other sources says nothing of today's
    assert [(r.check, r.cell) for r in checked.reasons] == [
        ("stale", "b"), ("status", "b"), ("status", "z")]
    assert checked.sources_checked == 2  # a and b; z never ran
    assert not checked.ok
    # stale rows add to the others: a missing cell is still reported
    both = evaluate(policy, cells, digests=NOW, expected=["a", "b", "gone"])
    assert [(r.check, r.cell) for r in both.reasons][:2] == [("missing", "gone"),
                                                            ("stale", "b")]


# --------------------------------------------------------------------------------------
# evaluate


def test_evaluate_reports_presence_counts_and_reasons_in_check_order() -> None:
    policy = Policy(name="p", drift_factor=2.0)
    mutant = _run("m", "killed")
    cells = [cell(name="a", status=Status.FAILED, headline="boom", ev_max_abs_diff="1"),
             cell(name="b", status=Status.CACHED), mutant]
    baseline = [cell(name="a", ev_max_abs_diff="1e-3"), cell(name="b"), cell(name="gone")]
    result = evaluate(policy, cells, baseline)
    assert [(r.check, r.cell) for r in result.reasons] == [
        ("missing", "gone"), ("status", "a"), ("drift", "a")]
    assert result.reasons[0].detail == "required by the policy, not in the report"
    assert (result.presence, result.baseline, result.required) == ("baseline", True, 3)
    assert dict(result.counts) == {"failed": 1, "cached": 1}
    assert (result.mutant_runs, result.mutants_killed, result.drift_compared) == (1, 1, 1)
    assert not result.ok

    matrix = evaluate(policy, cells, None, expected=["a", "b"])
    assert (matrix.presence, matrix.baseline, matrix.drift_compared) == ("matrix", False, None)
    bare = evaluate(Policy(name="p"), cells, baseline)  # no drift_factor: no drift check
    assert (bare.presence, bare.drift_compared) == ("baseline", None)
    assert [r.check for r in bare.reasons] == ["missing", "status"]


def test_an_empty_gate_says_what_matched_nothing() -> None:
    policy = Policy(name="p", tags=("release",))
    result = evaluate(policy, [cell(name="x")])
    assert result.reasons == (Reason("empty", "-", f"no cell matches {policy.describe_scope()}"),)
    assert (result.presence, result.required) == ("", 0)
