"""What a session does with a result: small policies, each testable on its own.

- :func:`interpret_mutant`: a mutant run is KILLED when the planted bug made the cell
  fail, SURVIVED when it passed, NOT JUDGED when its unmutated cell did not pass in the
  same run (a cell that fails anyway kills every bug planted in it, honestly or not).
- :class:`CrashRetry`: a crashed cell is run again alone, once; passing then makes it
  FLAKY, failing again keeps the first crash (with both stories in the message).

Example::

    >>> base = Result(cell_id="c", status=Status.PASSED)
    >>> r = Result(cell_id="c", status=Status.PASSED, mutant="bug")
    >>> interpret_mutant(r, base).status, interpret_mutant(r, base).evidence["mutant_outcome"]
    (<Status.SURVIVED: 'survived'>, 'survived')
    >>> interpret_mutant(r, replace(base, status=Status.FAILED)).status
    <Status.NOT_JUDGED: 'not_judged'>
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from cpmatrix.result import FailureKind, Result, Status
from cpmatrix.run.entry import Entry

__all__ = ["CrashRetry", "interpret_mutant"]


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
