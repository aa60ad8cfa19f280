"""The reports each rank of a pytest cell left, read back and judged once.

A rank writes ``<out>/<cell folder>/rank<R>/pytest.json``
(:mod:`cpmatrix.kinds.pytest.rank_session`): its classified phases, pytest's serialized
reports and the warnings recorded. A rank that died before writing it, or a file of another
shape, reads as no reports at all.

:func:`judgement` is the one place a test's verdict is judged from those files. The job
judges each result it makes (:func:`judged_cell`) and hands the :class:`Judged` on with
it; the pytest front replays that judgement (as pytest-xdist's controller replays the
worker's reports) and judges only a result no job judged: one the run composed later (a
crash that passed when retried, a repeat's combination), a cached pass, a cell that never
started.

Example::

    >>> from pathlib import Path
    >>> load(Path("/nonexistent"), 2)
    {}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cpmatrix.fsutil import read_json
from cpmatrix.kinds.pytest.verdict import PYTEST_CHECK, RankPhase, Verdict, is_own, judge
from cpmatrix.layout import rank_dir
from cpmatrix.result import FailureKind, RankFailure, Result, Status

__all__ = ["REPORTS_FILE", "Judged", "cut_off_of", "judged_cell", "judged_result", "judgement",
           "load", "phases_of"]

#: The file a rank writes in its folder of the cell.
REPORTS_FILE = "pytest.json"


def load(cell_dir: Path, size: int, nodeid: str | None = None) -> dict[int, dict[str, Any]]:
    """rank -> its record, for the ranks that left one (of ``nodeid``, when given)."""
    out: dict[int, dict[str, Any]] = {}
    for r in range(size):
        try:
            data = read_json(rank_dir(cell_dir, r) / REPORTS_FILE)
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or not isinstance(data.get("phases"), list):
            continue
        if nodeid is not None and data.get("nodeid") != nodeid:
            continue
        out[r] = data
    return out


def phases_of(records: Mapping[int, Mapping[str, Any]]) -> dict[int, list[RankPhase]]:
    """rank -> its classified phases."""
    out: dict[int, list[RankPhase]] = {}
    for r, record in records.items():
        try:
            out[r] = [RankPhase.from_dict(p) for p in record["phases"]]
        except (KeyError, TypeError, ValueError):
            continue
    return out


def _text(records: Mapping[int, Mapping[str, Any]], rank: int, when: str) -> str:
    for p in records.get(rank, {}).get("phases", ()):
        if p.get("when") == when:
            return str(p.get("text", ""))
    return ""


def judged_result(result: Result, verdict: Verdict,
                  records: Mapping[int, Mapping[str, Any]]) -> Result:
    """The cell's result as the test's verdict says: passed, xfailed and xpassed are
    ``passed``, a skip ``skipped``, a failure ``failed`` (a crash or hang keeps its status
    and stacks), each failure with the rank's own pytest report as its traceback."""
    evidence = {**result.evidence, "pytest": verdict.outcome,
                **({"left_state": verdict.left_state} if verdict.left_state else {})}
    if verdict.ok:
        status = Status.SKIPPED if verdict.outcome == "skipped" else (
            Status.CACHED if result.status is Status.CACHED else Status.PASSED)
        message = verdict.summary() if verdict.outcome != "passed" else ""
        return replace(result, status=status, kind=None, failing_ranks=(), failures=(),
                       message=message, evidence=evidence)
    mine: list[RankFailure] = []
    for phase in verdict.phases:
        if phase.outcome != "failed":
            continue
        if phase.rank is not None:
            mine.append(RankFailure(rank=phase.rank, message=phase.summary,
                                    traceback=_text(records, phase.rank, phase.when),
                                    check=PYTEST_CHECK))
        elif not result.failures or result.kind is FailureKind.ERROR:
            rank = verdict.failing_ranks[0] if verdict.failing_ranks else 0
            mine.append(RankFailure(rank=rank, message=phase.summary, traceback=phase.message,
                                    check=PYTEST_CHECK))
    kept: Sequence[RankFailure] = [f for f in result.failures if is_own(f)]
    if result.kind in (FailureKind.CRASH, FailureKind.TIMEOUT):
        kept = result.failures  # the stacks, the dead rank: the world's story stands
    status = result.status if result.status in (Status.CRASH, Status.TIMEOUT, Status.FLAKY,
                                                Status.INTERRUPTED) else Status.FAILED
    # A crash, a hang, a flaky rerun: the world's own message tells it (judging the
    # result again must read the same story); a test's own failure: its verdict.
    world_told = status in (Status.CRASH, Status.TIMEOUT, Status.FLAKY, Status.INTERRUPTED)
    return replace(result, status=status, kind=result.kind or FailureKind.ERROR,
                   failing_ranks=verdict.failing_ranks or result.failing_ranks,
                   failures=(*mine, *kept), evidence=evidence,
                   message=result.message if world_told else verdict.summary())


@dataclass(frozen=True, slots=True)
class Judged:
    """A test's verdict, the ranks' records it was judged from, and the result judged:
    its status, attempts and runs (a result the run composed from it later differs in
    one of them and is judged afresh)."""

    verdict: Verdict
    records: dict[int, dict[str, Any]]
    of: tuple[Status, int, int]


def _of(result: Result) -> tuple[Status, int, int]:
    return result.status, result.attempts, result.runs


def judgement(cell_dir: Path, size: int, result: Result,
              nodeid: str | None = None) -> Judged:
    """The test's verdict: the one handed on with ``result`` (``result.judged``) when it
    is this result's, else judged here from the ranks' files and the world's ``result``."""
    known = result.judged
    if isinstance(known, Judged) and known.of == _of(result):
        return known
    records = load(cell_dir, size, nodeid)
    verdict = judge(phases_of(records), size=size, result=result,
                    cut_off=cut_off_of(records))
    return Judged(verdict, records, _of(result))


def judged_cell(cell_dir: Path, size: int, result: Result,
                nodeid: str | None = None) -> Result:
    """The world's ``result`` of a pytest cell as its test's verdict says
    (:func:`judged_result`), with the :class:`Judged` handed on in ``judged``."""
    found = judgement(cell_dir, size, result, nodeid)
    out = judged_result(result, found.verdict, found.records)
    return replace(out, judged=Judged(found.verdict, found.records, _of(out)))


def cut_off_of(records: Mapping[int, Mapping[str, Any]]) -> dict[int, list[str]]:
    """rank -> the phases a peer cut it off in (:mod:`cpmatrix.worker.sever`).

    >>> cut_off_of({0: {"cut_off": [{"when": "call"}]}, 1: {}})
    {0: ['call']}
    """
    out: dict[int, list[str]] = {}
    for r, record in records.items():
        cut = record.get("cut_off")
        if isinstance(cut, list) and cut:
            out[r] = [str(c.get("when", "")) for c in cut if isinstance(c, dict)]
    return out
