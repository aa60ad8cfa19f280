"""The rule for repeated runs (``--runs-per-test N``): one status from the runs' statuses.

One pure function, :func:`repeated_status`, read by the session when it combines a cell's
runs (:func:`cpmatrix.supervise.policies.combine_runs`) and re-applied by the gate to the run
statuses a report records (``run_statuses``), so a report whose status disagrees with its
own runs cannot pass. Each run is first put in one class (:data:`RUN_CLASS`); the classes
decide, in this order (the table of docs/running.md):

1. a run that **failed** (failed, crash, timeout) and a run that **passed** (or one FLAKY
   run, which is both) -> FLAKY;
2. a run that failed -> the first failing run's status (whatever the others: a skipped or
   interrupted run never hides a failure);
3. a run **without a verdict** (interrupted, infra) -> the first such run's status (an
   incomplete measurement is never a pass, and no gate policy allows it);
4. a **skipped** run -> SKIPPED (even beside passes: a cell not measured N times has not
   passed N times; a gate allows it only with ``allow_skipped``);
5. every run passed -> PASSED.

Example::

    >>> S = Status
    >>> repeated_status([S.SKIPPED, S.FAILED, S.FAILED])
    <Status.FAILED: 'failed'>
    >>> repeated_status([S.PASSED, S.SKIPPED, S.TIMEOUT])
    <Status.FLAKY: 'flaky'>
    >>> repeated_status([S.SKIPPED, S.PASSED]), repeated_status([S.PASSED, S.PASSED])
    (<Status.SKIPPED: 'skipped'>, <Status.PASSED: 'passed'>)
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Final

from cpmatrix.result import Status

__all__ = ["RUN_CLASS", "RunClass", "parse_run_statuses", "repeated_status", "rule_index"]


class RunClass(StrEnum):
    """What one run says about its cell."""

    PASS = "pass"
    FAIL = "fail"
    #: Passed only when retried alone after a crash: a pass and a failure at once.
    BOTH = "pass and fail"
    NO_VERDICT = "no verdict"
    SKIP = "skip"


#: The class of every status a run can end with. Mutant statuses (killed, survived, not
#: judged) are absent: mutant runs are never repeated (``--mutants`` refuses N > 1).
RUN_CLASS: Final = {
    Status.PASSED: RunClass.PASS,
    Status.CACHED: RunClass.PASS,
    Status.FAILED: RunClass.FAIL,
    Status.CRASH: RunClass.FAIL,
    Status.TIMEOUT: RunClass.FAIL,
    Status.FLAKY: RunClass.BOTH,
    Status.INTERRUPTED: RunClass.NO_VERDICT,
    Status.INFRA: RunClass.NO_VERDICT,
    Status.SKIPPED: RunClass.SKIP,
}


def _classes(statuses: Sequence[Status]) -> list[RunClass]:
    if not statuses:
        raise ValueError("a repeated cell has at least one run")
    unknown = [s.value for s in statuses if s not in RUN_CLASS]
    if unknown:
        raise ValueError(f"not a status a repeated run can end with: {', '.join(unknown)} "
                         f"(allowed: {', '.join(s.value for s in RUN_CLASS)})")
    return [RUN_CLASS[s] for s in statuses]


def rule_index(statuses: Sequence[Status]) -> int:
    """Which row of the rule (1-5, the module docstring's order) decides ``statuses``.

    >>> rule_index([Status.PASSED, Status.INTERRUPTED])
    3
    """
    classes = _classes(statuses)
    passed = RunClass.PASS in classes or RunClass.BOTH in classes
    failed = RunClass.FAIL in classes or RunClass.BOTH in classes
    if failed and passed:
        return 1
    if failed:
        return 2
    if RunClass.NO_VERDICT in classes:
        return 3
    if RunClass.SKIP in classes:
        return 4
    return 5


def repeated_status(statuses: Sequence[Status]) -> Status:
    """The cell's status from its runs' statuses (in run order); ``ValueError`` for no
    runs or a status no repeated run can end with."""
    row = rule_index(statuses)
    if row == 1:
        return Status.FLAKY
    wanted = {2: RunClass.FAIL, 3: RunClass.NO_VERDICT, 4: RunClass.SKIP}.get(row)
    if wanted is None:
        return Status.PASSED
    return next(s for s in statuses if RUN_CLASS[s] is wanted)


def parse_run_statuses(text: str) -> tuple[Status, ...]:
    """The ``run_statuses`` property of a report (``skipped,failed,failed``) as statuses;
    ``ValueError`` naming the bad word.

    >>> parse_run_statuses("skipped,failed")
    (<Status.SKIPPED: 'skipped'>, <Status.FAILED: 'failed'>)
    """
    out = []
    for word in text.split(","):
        try:
            out.append(Status(word.strip()))
        except ValueError:
            raise ValueError(f"run_statuses: {word.strip()!r} is not a status") from None
    return tuple(out)
