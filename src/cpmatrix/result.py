"""What became of a cell: :class:`Status`, :class:`Result`, serializable both ways.

Every planned cell ends as exactly one Result.

Example::

    >>> r = Result(cell_id="t[unit,1x1,fp64,autocast=off,reference]@cpu", status=Status.PASSED)
    >>> Result.from_dict(r.to_dict()) == r
    True
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["FailureKind", "RankFailure", "Result", "Status"]


class Status(StrEnum):
    PASSED = "passed"
    CACHED = "cached"
    FAILED = "failed"
    FLAKY = "flaky"
    TIMEOUT = "timeout"
    CRASH = "crash"
    SKIPPED = "skipped"

    @property
    def ok(self) -> bool:
        """Passed (fresh or cached). FLAKY passed on retry but is not ok for a gate."""
        return self in (Status.PASSED, Status.CACHED)


class FailureKind(StrEnum):
    #: A Python exception in the case (any rank).
    ERROR = "error"
    #: A rank died (signal, os._exit, segfault) or the world broke without a traceback.
    CRASH = "crash"
    #: The cell ran past its timeout (hang or endless loop).
    TIMEOUT = "timeout"


@dataclass(frozen=True, slots=True, kw_only=True)
class RankFailure:
    """What one failing rank left behind."""

    rank: int
    #: Exception type and message, or how the rank died.
    message: str
    #: Full traceback (error), Python stacks (timeout) or empty (crash).
    traceback: str = ""
    #: The toolkit check that raised (``ParityError.check``), if any.
    check: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    cell_id: str
    status: Status
    kind: FailureKind | None = None
    failing_ranks: tuple[int, ...] = ()
    failures: tuple[RankFailure, ...] = ()
    #: The last lines of every rank's log during the cell (on failure).
    stderr_tails: dict[int, str] = field(default_factory=dict)
    #: Evidence from ``cell.record``; a key only some ranks agree on gets ``@rankN``.
    evidence: dict[str, Any] = field(default_factory=dict)
    #: Wall time of the cell in its world (max over ranks) and of the case alone.
    duration_s: float = 0.0
    case_s: float = 0.0
    attempts: int = 1
    #: Free-form explanation (e.g. "passed on retry after: crash ...").
    message: str = ""
    #: Where the cell's files are (relative to the run's output folder).
    out_dir: str = ""
    #: The mutant switched on for this run, if any.
    mutant: str = ""

    @property
    def first_failure(self) -> RankFailure | None:
        return self.failures[0] if self.failures else None

    def headline(self) -> str:
        """One line for summaries: status, kind, ranks and the first line of the cause."""
        if self.status.ok:
            return f"{self.status.value}"
        ranks = ",".join(map(str, self.failing_ranks)) or "?"
        first = self.first_failure
        cause = first.message.splitlines()[0] if first and first.message else self.message
        kind = f" ({self.kind.value})" if self.kind else ""
        return f"{self.status.value}{kind} on rank {ranks}: {cause}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        d["kind"] = self.kind.value if self.kind else None
        d["failing_ranks"] = list(self.failing_ranks)
        d["failures"] = [asdict(f) for f in self.failures]
        d["stderr_tails"] = {str(k): v for k, v in self.stderr_tails.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Result:
        return cls(
            cell_id=d["cell_id"],
            status=Status(d["status"]),
            kind=FailureKind(d["kind"]) if d.get("kind") else None,
            failing_ranks=tuple(d.get("failing_ranks", ())),
            failures=tuple(RankFailure(**f) for f in d.get("failures", ())),
            stderr_tails={int(k): v for k, v in d.get("stderr_tails", {}).items()},
            evidence=dict(d.get("evidence", {})),
            duration_s=float(d.get("duration_s", 0.0)),
            case_s=float(d.get("case_s", 0.0)),
            attempts=int(d.get("attempts", 1)),
            message=d.get("message", ""),
            out_dir=d.get("out_dir", ""),
            mutant=d.get("mutant", ""),
        )
