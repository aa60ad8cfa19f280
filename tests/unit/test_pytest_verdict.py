"""One multi-rank test's verdict from every rank's pytest reports and the world's result.

Pure: no processes. Each row is a situation the ranks and the world can be in; the
verdict is what pytest is told (and what a matrix report holds).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from cpmatrix.kinds.pytest.records import judged_result, phases_of
from cpmatrix.kinds.pytest.verdict import RankPhase, Verdict, fault_of, judge
from cpmatrix.result import FailureKind, RankFailure, Result, Status


def ph(when: str, kind: str, summary: str = "", text: str = "") -> RankPhase:
    outcome = {"xfailed": "skipped", "xpassed": "passed"}.get(kind, kind)
    return RankPhase(when=when, outcome=outcome, kind=kind, summary=summary, text=text)


def ran(call: str, summary: str = "") -> list[RankPhase]:
    """setup passed, call ``call``, teardown passed."""
    return [ph("setup", "passed"), ph("call", call, summary), ph("teardown", "passed")]


def res(status: Status = Status.PASSED, kind: FailureKind | None = None,
        ranks: tuple[int, ...] = (), failures: tuple[RankFailure, ...] = (),
        message: str = "") -> Result:
    return Result(cell_id="c", status=status, kind=kind, failing_ranks=ranks,
                  failures=failures, message=message)


def pytest_failure(rank: int, message: str = "failed") -> RankFailure:
    return RankFailure(rank=rank, message=message, check="pytest")


def outcome_of(v: Verdict) -> tuple[str, list[tuple[str, str, int | None]]]:
    return v.outcome, [(p.when, p.outcome, p.rank) for p in v.phases]


# ------------------------------------------------------------------ agreed outcomes

CASES: list[tuple[str, dict[int, list[RankPhase]], Result | None, str, str]] = [
    ("all pass", {0: ran("passed"), 1: ran("passed")}, None, "passed", ""),
    ("skip agreed", {0: ran("skipped", "no gpu"), 1: ran("skipped", "no gpu")}, None,
     "skipped", "no gpu"),
    ("skip in setup agreed", {r: [ph("setup", "skipped", "marker"), ph("teardown", "passed")]
                              for r in range(2)}, None, "skipped", "marker"),
    ("xfail agreed", {0: ran("xfailed", "known"), 1: ran("xfailed", "known")}, None,
     "xfailed", "known"),
    ("xfail on one rank, passed on the other: the test failed as expected",
     {0: ran("xfailed", "known"), 1: ran("xpassed", "known")}, None, "xfailed", "known"),
    ("xpass everywhere", {0: ran("xpassed", "known"), 1: ran("xpassed", "known")}, None,
     "xpassed", "known"),
]


@pytest.mark.parametrize(("situation", "ranks", "result", "outcome", "reason"), CASES,
                         ids=[c[0] for c in CASES])
def test_agreed_outcomes(situation: str, ranks: dict[int, list[RankPhase]],
                         result: Result | None, outcome: str, reason: str) -> None:
    v = judge(ranks, size=2, result=result)
    assert (v.outcome, v.reason) == (outcome, reason), situation
    assert v.ok


def test_a_skip_not_agreed_is_a_failure_naming_both_sides() -> None:
    v = judge({0: ran("passed"), 1: ran("skipped", "no gpu"), 2: ran("passed")}, size=3)
    assert v.outcome == "failed"
    call = next(p for p in v.phases if p.when == "call")
    assert call.rank is None and call.outcome == "failed"
    assert "skipped on rank 1 (no gpu), passed on ranks 0, 2" in call.message


def test_skipped_on_one_rank_and_failed_on_another_is_that_failure() -> None:
    v = judge({0: ran("skipped", "no gpu"), 1: ran("failed", "AssertionError: x")}, size=2)
    call = next(p for p in v.phases if p.when == "call")
    assert (v.outcome, call.rank) == ("failed", 1)
    assert "skip must be agreed" in call.message
    assert v.reason == "AssertionError: x (rank 1)"


def test_the_failing_rank_stands_for_the_test_and_the_attributed_one_first() -> None:
    ranks = {0: ran("passed"), 1: ran("failed", "echo of a peer"), 2: ran("failed", "own")}
    assert next(p.rank for p in judge(ranks, size=3).phases if p.when == "call") == 1
    # cpmatrix's attribution names rank 2's error first (rank 1's only echoed it).
    world = res(Status.FAILED, FailureKind.ERROR, ranks=(2,),
                failures=(pytest_failure(2), pytest_failure(1)))
    v = judge(ranks, size=3, result=world)
    assert next(p.rank for p in v.phases if p.when == "call") == 2
    assert v.failing_ranks == (2,)


def test_a_failed_setup_has_no_call_phase_and_is_an_error() -> None:
    ranks = {0: [ph("setup", "failed", "fixture broke"), ph("teardown", "passed")],
             1: ran("passed")}
    v = judge(ranks, size=2)
    assert outcome_of(v) == ("error", [("setup", "failed", 0), ("teardown", "passed", 0)])


def test_ranks_torn_down_after_a_failure_add_no_failure_of_their_own() -> None:
    # Rank 0 failed; rank 1 waited for it in a collective and was torn down mid-call.
    ranks = {0: ran("failed", "AssertionError"), 1: [ph("setup", "passed")]}
    world = res(Status.FAILED, FailureKind.ERROR, ranks=(0,), failures=(pytest_failure(0),))
    v = judge(ranks, size=2, result=world)
    assert outcome_of(v) == ("failed", [("setup", "passed", 0), ("call", "failed", 0),
                                        ("teardown", "passed", 0)])
    call = v.phases[1]
    assert "rank 1 did not finish the call phase" in call.message


def test_an_expected_failure_whose_peers_were_cut_off_is_xfailed() -> None:
    # Rank 0 failed as expected before a collective; rank 1 waited in it, torn down.
    ranks = {0: ran("xfailed", "planted"), 1: [ph("setup", "passed")]}
    world = res(Status.FAILED, FailureKind.ERROR, ranks=(0,), failures=(pytest_failure(0),))
    v = judge(ranks, size=2, result=world)
    assert outcome_of(v) == ("xfailed", [("setup", "passed", 0), ("call", "skipped", 0),
                                         ("teardown", "passed", 0)])
    assert "rank 1 did not finish the call phase" in v.phases[1].message


@pytest.mark.parametrize("first", ["failed", "xfailed"])
def test_peers_cut_off_by_a_failing_rank_are_noted_as_cut_off_not_blamed(first: str) -> None:
    # Rank 0 failed (as expected or not) and cut the cell; rank 1, waiting in a
    # collective, reported its call as cut off (not among its phases) and tore down.
    ranks = {0: ran(first, "planted"), 1: [ph("setup", "passed"), ph("teardown", "passed")]}
    v = judge(ranks, size=2, cut_off={1: ["call"]})
    assert v.outcome == ("failed" if first == "failed" else "xfailed"), v
    assert v.phases[1].rank == 0 and v.failing_ranks in ((0,), ())
    assert "rank 1 did not finish the call phase (cut off while waiting for the failing " \
        "rank)" in v.phases[1].message


def test_a_skip_whose_peer_was_cut_off_waiting_for_it_is_a_skip_not_agreed() -> None:
    ranks = {0: ran("skipped", "rank 0 only"),
             1: [ph("setup", "passed"), ph("teardown", "passed")]}
    v = judge(ranks, size=2, cut_off={1: ["call"]})
    assert v.outcome == "failed"
    assert v.reason == ("skip not agreed: skipped on rank 0 (rank 0 only), rank 1 cut off "
                        "waiting for it in a collective")
    # Without the peer's word it is what it was: a rank that sent no report.
    assert "rank 1 sent no report for the call phase" in judge(ranks, size=2).reason


def test_a_strict_xpass_on_one_rank_fails_whatever_its_peers_did() -> None:
    strict = RankPhase(when="call", outcome="failed", kind="xpassed",
                       summary="[XPASS(strict)] planted")
    ranks = {0: ran("passed"), 1: [ph("setup", "passed"), strict, ph("teardown", "passed")]}
    v = judge(ranks, size=2)
    assert v.outcome == "failed" and v.phases[1].rank == 1, v
    # A non-strict xpass next to a pass stays a pass; a strict one on every rank fails.
    assert judge({0: ran("passed"), 1: ran("xpassed")}, size=2).outcome == "passed"
    both = {r: [ph("setup", "passed"), strict, ph("teardown", "passed")] for r in (0, 1)}
    assert judge(both, size=2).outcome == "failed"


def test_a_rank_without_reports_and_no_fault_is_a_failure() -> None:
    v = judge({0: ran("passed")}, size=2)
    assert v.outcome == "error"  # its first phase: the setup
    assert "rank 1 sent no report for the setup phase" in v.phases[0].message


# -------------------------------------------------------------------------- faults

def test_a_crash_fails_the_phase_the_dead_rank_did_not_finish_naming_it() -> None:
    ranks = {0: [ph("setup", "passed")], 1: [ph("setup", "passed")]}
    world = res(Status.CRASH, FailureKind.CRASH, ranks=(1,), message="a rank died",
                failures=(RankFailure(rank=1, message="rank 1 died during the cell "
                                                      "(killed by signal SIGKILL)"),))
    v = judge(ranks, size=2, result=world)
    assert outcome_of(v) == ("failed", [("setup", "passed", 0), ("call", "failed", None),
                                        ("teardown", "passed", None)])
    text = v.phases[1].message
    assert "rank 1 of 2 died during the test" in text and "SIGKILL" in text
    assert v.failing_ranks == (1,)


def test_a_hang_in_setup_fails_the_setup_with_the_stacks() -> None:
    ranks = {0: [ph("setup", "passed")]}  # rank 1 never finished its fixture
    world = res(Status.TIMEOUT, FailureKind.TIMEOUT, ranks=(1,),
                message="cell ran past its timeout of 6 s",
                failures=(RankFailure(rank=1, message="still in the cell",
                                      traceback='File "fixture.py", line 3 in slow'),))
    v = judge(ranks, size=2, result=world)
    assert outcome_of(v) == ("error", [("setup", "failed", None),
                                       ("teardown", "passed", None)])
    assert "hung" in v.phases[0].message and "fixture.py" in v.phases[0].message


def test_state_left_behind_after_passing_is_noted_not_the_outcome() -> None:
    # Natively the test's ranks end with what it left (or a later test meets it): the
    # test itself passed. Its rank runs no more tests; the note says what was left.
    leak = RankFailure(rank=0, message="process_state: the case replaced torch.x",
                       check="process_state")
    world = res(Status.FAILED, FailureKind.ERROR, ranks=(0,), failures=(leak,))
    v = judge({0: ran("passed"), 1: ran("passed")}, size=2, result=world)
    assert outcome_of(v)[0] == "passed" and v.ok
    assert v.phases[-1].when == "teardown" and v.phases[-1].outcome == "passed"
    assert "process_state: the case replaced torch.x" in v.phases[-1].message
    assert v.left_state == "process_state: the case replaced torch.x"
    # ... and a skipped test keeps its skip.
    skipped = judge({0: ran("skipped"), 1: ran("skipped")}, size=2, result=world)
    assert outcome_of(skipped)[0] == "skipped" and skipped.left_state


def test_a_shared_thing_broken_is_not_state_left_behind() -> None:
    # A group destroyed, an unpaired collective, a stray child: the ranks go on (not
    # recycled), so the test that did it fails.
    shared = RankFailure(rank=1, message="process_state: the case destroyed process "
                         "group(s) 1", check="process_shared")
    world = res(Status.FAILED, FailureKind.ERROR, ranks=(1,), failures=(shared,))
    v = judge({0: ran("passed"), 1: ran("passed")}, size=2, result=world)
    assert outcome_of(v)[0] == "error" and not v.left_state


def test_state_left_with_another_fault_of_cpmatrix_still_fails() -> None:
    leak = RankFailure(rank=0, message="process_state: the case replaced torch.x",
                       check="process_state")
    groups = RankFailure(rank=1, message="the cell left a group open", check="groups")
    world = res(Status.FAILED, FailureKind.ERROR, ranks=(0, 1), failures=(leak, groups))
    v = judge({0: ran("passed"), 1: ran("passed")}, size=2, result=world)
    assert outcome_of(v)[0] == "error" and not v.left_state


def test_state_left_by_a_failing_test_is_noted_on_its_failure() -> None:
    both = RankFailure(rank=0, message="failed in call; process_state: torch.x replaced",
                       check="pytest")
    world = res(Status.FAILED, FailureKind.ERROR, ranks=(0,), failures=(both,))
    v = judge({0: ran("failed", "boom"), 1: ran("passed")}, size=2, result=world)
    call = next(p for p in v.phases if p.when == "call")
    assert call.rank == 0 and "process_state: torch.x replaced" in call.message


def test_flaky_is_a_failure() -> None:
    world = res(Status.FLAKY, FailureKind.CRASH, ranks=(1,),
                message="passed when retried alone; first attempt: crash")
    v = judge({0: ran("passed"), 1: ran("passed")}, size=2, result=world)
    assert v.outcome == "failed" and v.reason.startswith("flaky")


def test_pytest_failures_alone_are_no_fault() -> None:
    assert fault_of(res(Status.FAILED, FailureKind.ERROR, failures=(pytest_failure(0),))) \
        is None


# ----------------------------------------------------- the world's result, rewritten

def records(ranks: dict[int, list[RankPhase]]) -> dict[int, dict[str, Any]]:
    return {r: {"phases": [{"when": p.when, "outcome": p.outcome, "kind": p.kind,
                            "summary": p.summary, "text": p.text or f"text of {r}",
                            "index": i} for i, p in enumerate(ps)]}
            for r, ps in ranks.items()}


@pytest.mark.parametrize(("call", "status"), [("passed", Status.PASSED),
                                               ("xfailed", Status.PASSED),
                                               ("skipped", Status.SKIPPED),
                                               ("failed", Status.FAILED)])
def test_the_result_says_what_the_verdict_says(call: str, status: Status) -> None:
    ranks = {0: ran(call, "why"), 1: ran(call, "why")}
    recs = records(ranks)
    world = res() if call in ("passed", "skipped") else res(
        Status.FAILED, FailureKind.ERROR, ranks=(0, 1),
        failures=(pytest_failure(0), pytest_failure(1)))
    verdict = judge(phases_of(recs), size=2, result=world)
    judged = judged_result(world, verdict, recs)
    assert judged.status is status
    assert judged.evidence["pytest"] == verdict.outcome
    if status is Status.FAILED:
        assert judged.failures[0].traceback == "text of 0"
        assert judged.failures[0].check == "pytest"
    # Judging the judged result again reads the same verdict.
    assert judge(phases_of(recs), size=2, result=judged) == verdict


def test_a_crash_keeps_its_status_its_stacks_and_its_story() -> None:
    ranks = {0: [ph("setup", "passed")], 1: [ph("setup", "passed")]}
    dead = RankFailure(rank=1, message="rank 1 died during the cell (killed by SIGKILL)")
    world = res(Status.CRASH, FailureKind.CRASH, ranks=(1,), failures=(dead,),
                message="a rank died; the world was torn down")
    recs = records(ranks)
    verdict = judge(phases_of(recs), size=2, result=world)
    judged = judged_result(world, verdict, recs)
    assert (judged.status, judged.kind, judged.message) == (
        Status.CRASH, FailureKind.CRASH, world.message)
    assert dead in judged.failures
    assert judge(phases_of(recs), size=2, result=judged) == verdict
    # ... and a cached pass stays a cached pass.
    cached = judged_result(replace(res(), status=Status.CACHED),
                           judge(phases_of(records({0: ran("passed")})), size=1),
                           records({0: ran("passed")}))
    assert cached.status is Status.CACHED
