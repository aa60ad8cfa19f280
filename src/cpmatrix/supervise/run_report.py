"""What a run produced: :class:`RunReport` (results in plan order, jobs, the stop).

Example::

    >>> from pathlib import Path
    >>> RunReport(results={}, wall_s=0.0, report_path=Path("out/report.xml")).counts()
    {}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cpmatrix.result import Result, Status, testcase_name

__all__ = ["RunReport"]


@dataclass
class RunReport:
    """What a run produced; ``results`` maps entry key -> result, in plan order."""

    results: dict[str, Result]
    wall_s: float
    report_path: Path
    #: Executor name -> jobs planned, and jobs started (restarts and retries included).
    planned: dict[str, int] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    #: The executors whose jobs are worlds of ranks (counted by :attr:`worlds`).
    world_jobs: frozenset[str] = frozenset()
    #: The signal that stopped the run early (SIGINT, SIGTERM), if any.
    stopped_by: int | None = None

    @property
    def worlds(self) -> int:
        """Worlds planned (the jobs of :attr:`world_jobs`' executors)."""
        return sum(self.planned.get(name, 0) for name in self.world_jobs)

    @property
    def world_starts(self) -> int:
        """Worlds started, restarts and retries included."""
        return sum(self.starts.get(name, 0) for name in self.world_jobs)

    def mutant_line(self) -> str:
        """``mutants: K/J killed (kill rate X%)`` over the judged ones, naming the
        survivors and the mutants not judged (their unmutated cell did not pass)."""
        runs = [r for r in self.results.values() if r.mutant]
        unjudged = [r for r in runs if r.status is Status.NOT_JUDGED]
        judged = [r for r in runs if r.status is not Status.NOT_JUDGED]
        killed = [r for r in judged if r.status is Status.KILLED]
        survivors = [testcase_name(r.cell_id, r.mutant) for r in judged if r not in killed]
        rate = 100.0 * len(killed) / len(judged) if judged else 100.0
        line = f"mutants: {len(killed)}/{len(judged)} killed (kill rate {rate:.1f}%)"
        if unjudged:
            line += (f"; {len(unjudged)} not judged (left out of the kill rate: their "
                     "unmutated cell did not pass in this run)")
        if survivors:
            line += "\nsurvived (vacuous for these bugs):\n  " + "\n  ".join(survivors)
        if unjudged:
            line += "\nnot judged (fix the cell first):\n  " + "\n  ".join(
                testcase_name(r.cell_id, r.mutant) for r in unjudged)
        return line

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results.values():
            out[r.status.value] = out.get(r.status.value, 0) + 1
        return out
