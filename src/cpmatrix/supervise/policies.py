"""What a session does with a result: small policies, each testable on its own.

- :func:`interpret_mutant`: a mutant run is KILLED when the planted bug made the cell
  fail, SURVIVED when it passed, NOT JUDGED when its unmutated cell did not pass in the
  same run (a cell that fails anyway kills every bug planted in it, honestly or not).
- :class:`CrashRetry`: a crashed cell is run again alone, once; passing then makes it
  FLAKY, failing again keeps the first crash (with both stories in the message).
- :func:`combine_runs`: the N runs of a cell (``--runs-per-test N``) as one verdict,
  Bazel's ``--runs_per_test_detects_flakes`` by the rule of :mod:`cpmatrix.repeated`.

Example::

    >>> base = Result(cell_id="c", status=Status.PASSED)
    >>> r = Result(cell_id="c", status=Status.PASSED, mutant="bug")
    >>> interpret_mutant(r, base).status, interpret_mutant(r, base).evidence["mutant_outcome"]
    (<Status.SURVIVED: 'survived'>, 'survived')
    >>> interpret_mutant(r, replace(base, status=Status.FAILED)).status
    <Status.NOT_JUDGED: 'not_judged'>
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from cpmatrix.repeated import RUN_CLASS, RunClass, repeated_status, rule_index
from cpmatrix.result import FailureKind, Result, Status, testcase_name
from cpmatrix.supervise.entry import Entry

__all__ = ["CrashRetry", "combine_entries", "combine_runs", "interpret_mutant", "next_run"]


def interpret_mutant(result: Result, base: Result | None) -> Result:
    """Judge a mutant run against its unmutated cell's result in the same run (``base``;
    None: it never ran). KILLED: the bug made a passing cell fail (``killed_by`` names the
    check). SURVIVED: the cell passed with the bug. NOT JUDGED: the unmutated cell did not
    pass, or the mutant run could not start: nothing can be said about the bug."""
    if base is None or not base.status.ok:
        why = ("its unmutated cell did not run in this run" if base is None else
               f"its unmutated cell {base.status.label} in this run ({base.headline()})")
        return replace(
            result, status=Status.NOT_JUDGED,
            evidence={**result.evidence, "mutant_outcome": "not_judged"},
            message=f"mutant {result.mutant!r} not judged: {why}, so a failure with the bug "
            "planted proves nothing; fix the cell first",
        )
    if result.message.startswith("could not start"):
        return replace(
            result, status=Status.NOT_JUDGED,
            evidence={**result.evidence, "mutant_outcome": "not_judged"},
            message=f"mutant {result.mutant!r} not judged: {result.message}")
    if result.status is Status.PASSED:
        return replace(
            result, status=Status.SURVIVED, kind=FailureKind.ERROR,
            evidence={**result.evidence, "mutant_outcome": "survived"},
            message=f"mutant {result.mutant!r} survived: the cell passed with this bug "
            "planted, so the test is vacuous for it",
        )
    first = result.first_failure
    by = (first.check if first and first.check else "") or (
        first.message.split(":")[0] if first and first.message else "") or (
        result.kind.value if result.kind else "failure")
    return replace(
        result, status=Status.KILLED, kind=None,
        evidence={**result.evidence, "mutant_outcome": "killed", "killed_by": by},
        message=f"mutant {result.mutant!r} killed by {by}: {result.headline()}",
    )


@dataclass
class CrashRetry:
    """Tell FLAKY from FAILED: retry a crashed cell alone, once.

    :meth:`decide` returns ``(result, None)`` when the result is final, or
    ``(None, entry)`` when ``entry`` (the same cell, attempt 2) must run first.
    """

    first_crash: dict[str, Result] = field(default_factory=dict)

    def decide(self, entry: Entry, result: Result, *, retries: bool,
               ) -> tuple[Result | None, Entry | None]:
        key = entry.key
        if result.status is Status.INFRA:  # no verdict at all: nothing to retry or compare
            self.first_crash.pop(key, None)
            return result, None
        if entry.attempt > 1 and key in self.first_crash:
            first = self.first_crash.pop(key)
            if result.status is Status.PASSED:
                return replace(
                    first, status=Status.FLAKY, attempts=entry.attempt,
                    evidence=result.evidence, duration_s=result.duration_s,
                    case_s=result.case_s,
                    message=f"passed when retried alone; first attempt: {first.headline()}",
                ), None
            return replace(first, attempts=entry.attempt,
                           message=f"{first.message}; failed again when retried alone "
                           f"({result.headline()})".lstrip("; ")), None
        if (retries and entry.attempt == 1 and result.kind is FailureKind.CRASH
                and not result.message.startswith("could not start")):
            self.first_crash[key] = result
            return None, replace(entry, attempt=2)
        return result, None


def combine_runs(runs: Sequence[Result]) -> Result:
    """One verdict for the runs of a cell (in run order), carrying the counts; the status
    is :func:`cpmatrix.repeated.repeated_status` of the runs' (any failed run makes the
    cell FLAKY or failed, never skipped; see that module for the whole rule). The result
    it is built from is the first run of the class that decided (the first failing run's
    kind, ranks and failures for FLAKY and failed).

    >>> ok, bad = Result(cell_id="c", status=Status.PASSED), Result(
    ...     cell_id="c", status=Status.FAILED, message="boom")
    >>> r = combine_runs([ok, bad, ok])
    >>> r.status, r.runs, r.runs_passed, r.run_failures
    (<Status.FLAKY: 'flaky'>, 3, 2, ('run 2: failed on rank ?: boom',))
    >>> combine_runs([bad, bad]).status, combine_runs([ok, ok]).status
    (<Status.FAILED: 'failed'>, <Status.PASSED: 'passed'>)
    """
    statuses = [r.status for r in runs]
    status = repeated_status(statuses)
    row = rule_index(statuses)
    decides = _DECIDES[row]
    base = next(r for r in runs if RUN_CLASS[r.status] in decides)
    passed = sum(r.status is Status.PASSED for r in runs)
    lines = tuple(f"run {i}: {r.headline()}" for i, r in enumerate(runs, 1)
                  if r.status is not Status.PASSED)
    counts = f"{passed}/{len(runs)} runs passed"
    mean_s = sum(r.duration_s for r in runs) / len(runs)
    message = {
        1: f"flaky: {counts}; " + "; ".join(lines),
        2: f"failed {sum(RUN_CLASS[s] is RunClass.FAIL for s in statuses)} of {len(runs)} "
           f"runs ({counts}): " + "; ".join(lines),
        3: f"{base.message} ({counts}, {len(lines)} without a pass)",
        4: f"{base.message} ({counts}, {len(lines)} skipped)",
        5: counts,
    }[row]
    return replace(base, status=status, runs=len(runs), runs_passed=passed,
                   run_failures=lines, run_statuses=tuple(statuses),
                   duration_s=round(mean_s, 4), attempts=max(r.attempts for r in runs),
                   message=message)


#: Which runs a row of the rule takes the combined result from.
_DECIDES: dict[int, tuple[RunClass, ...]] = {
    1: (RunClass.FAIL, RunClass.BOTH), 2: (RunClass.FAIL,), 3: (RunClass.NO_VERDICT,),
    4: (RunClass.SKIP,), 5: (RunClass.PASS,)}


def next_run(numbers: dict[str, int], cell_id: str) -> int:
    """The next run number of ``cell_id`` (1, 2, ...), counted in ``numbers``."""
    numbers[cell_id] = numbers.get(cell_id, 0) + 1
    return numbers[cell_id]


def combine_entries(planned: Sequence[Entry], results: Mapping[str, Result],
              by_batch: Mapping[str, list[str]],
              ) -> tuple[dict[str, Result], dict[str, list[str]]]:
    """Each cell's runs as one result under its testcase name (in plan order), and the
    batches holding them (each cell in the batch of its first run)."""
    runs: dict[str, list[tuple[int, Result]]] = {}
    name_of: dict[str, str] = {}
    for e in planned:
        name = testcase_name(e.cell.id, e.mutant)
        name_of[e.key] = name
        runs.setdefault(name, []).append((e.run, results[e.key]))
    combined = {name: combine_runs([r for _, r in sorted(rs, key=lambda nr: nr[0])])
                if any(n for n, _ in rs) else rs[0][1]  # a cached or skipped cell: as is
                for name, rs in runs.items()}
    batches: dict[str, list[str]] = {}
    placed: set[str] = set()
    for batch, keys in by_batch.items():
        for key in keys:
            name = name_of.get(key, key)
            if name not in placed:
                placed.add(name)
                batches.setdefault(batch, []).append(name)
    return combined, batches
