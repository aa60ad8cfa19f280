"""What a session does with a result: small policies, each testable on its own.

- :func:`interpret_mutant`: a mutant run passes when the planted bug made the cell fail.
- :class:`CrashRetry`: a crashed cell is run again alone, once; passing then makes it
  FLAKY, failing again keeps the first crash (with both stories in the message).

Example::

    >>> r = Result(cell_id="c", status=Status.PASSED, mutant="bug")
    >>> interpret_mutant(r).status, interpret_mutant(r).evidence["mutant_outcome"]
    (<Status.FAILED: 'failed'>, 'survived')
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from cpmatrix.result import FailureKind, Result, Status
from cpmatrix.run.entry import Entry

__all__ = ["CrashRetry", "interpret_mutant"]


def interpret_mutant(result: Result) -> Result:
    """A mutant run passes when the planted bug made the cell fail (it was killed)."""
    if result.status is Status.PASSED:
        return replace(
            result, status=Status.FAILED, kind=FailureKind.ERROR,
            evidence={**result.evidence, "mutant_outcome": "survived"},
            message=f"mutant {result.mutant!r} survived: the cell passed with this bug "
            "planted, so the test is vacuous for it",
        )
    if result.message.startswith("could not start"):
        return result  # infrastructure, not a kill
    first = result.first_failure
    by = (first.check if first and first.check else "") or (
        first.message.split(":")[0] if first and first.message else "") or (
        result.kind.value if result.kind else "failure")
    return replace(
        result, status=Status.PASSED, kind=None,
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
