"""What a cell's outcomes mean: no processes, pure but for reading the launcher's root
cause (the world executor's verdicts).

Outcomes first, message patterns last: a rank whose own outcome is an error caused the
failure; its error is collateral ("a peer left the collective") only when its message
says so *and* such a peer exists. How a rank died comes from its wait status or from the
launcher (:func:`launcher_root_cause`): the fork launcher's typed
:class:`~cpmatrix.worker.protocol.RootCause`, or torchrun's own "Root Cause" text block.

Example::

    >>> merge_evidence([{"x": 1, "r": 0}, {"x": 1, "r": 1}])
    {'x': 1, 'r': 0, 'r@rank1': 1}
    >>> torchrun_root_cause("Root Cause (first observed failure):\\n  rank : 1\\n  exitcode : -9")
    (1, 'killed by signal SIGKILL')
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Sequence
from typing import Any, Final

from cpmatrix.cache.key import merge_reads
from cpmatrix.fsutil import read_segment
from cpmatrix.result import FailureKind, RankFailure, Result, Status
from cpmatrix.supervise.entry import Entry
from cpmatrix.worker.protocol import Outcome, RootCause, WorldFolder, read_typed

__all__ = ["COLLATERAL", "WHOLE", "describe_status", "exit_words", "launcher_root_cause",
           "merge_evidence", "result_from_outcomes", "split_errors", "torchrun_root_cause"]

#: Messages of a rank whose peer went away: a consequence, not the cause.
COLLATERAL: Final = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|"
    r"communicator was aborted|Timed out waiting|ProcessGroupGloo.*closed",
    re.IGNORECASE,
)
#: A launcher's log or a stack dump is read whole (up to its last 16 MiB).
WHOLE: Final = 1 << 24
_ROOT_CAUSE: Final = re.compile(r"rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)", re.DOTALL)


def describe_status(status: int) -> str:
    """A wait status in words: ``killed by signal SIGKILL``, ``exited with code 13``."""
    if os.WIFSIGNALED(status):
        return f"killed by signal {_signame(os.WTERMSIG(status))}"
    if os.WIFEXITED(status):
        return f"exited with code {os.WEXITSTATUS(status)}"
    return f"wait status {status}"


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def exit_words(code: int) -> str:
    """A launcher's exit code in words (negative: the signal that killed it).

    >>> exit_words(-9), exit_words(7)
    ('killed by signal SIGKILL', 'exited with code 7')
    """
    return f"killed by signal {_signame(-code)}" if code < 0 else f"exited with code {code}"


def torchrun_root_cause(log_text: str) -> tuple[int, str] | None:
    """The rank and how it ended, as torchrun names the first observed failure.

    torchrun's own text (its format, not cpmatrix's protocol): read for that launcher
    only; the fork launcher's is a typed record (:func:`launcher_root_cause`).
    """
    idx = log_text.rfind("Root Cause")
    if idx < 0:
        return None
    m = _ROOT_CAUSE.search(log_text, idx)
    if m is None:
        return None
    return int(m.group(1)), exit_words(int(m.group(2)))


def launcher_root_cause(launcher: str, folder: WorldFolder, run: str,
                        ) -> tuple[int, str] | None:
    """The world rank that failed first and how, as the world's launcher of run ``run``
    names it; None when it named none, or the record is another run's (then the
    supervisor goes by the rank pids it watched)."""
    if launcher == "torchrun":
        return torchrun_root_cause(read_segment(folder.launcher_log, cap=WHOLE))
    record = read_typed(folder.root_cause, RootCause, run=run)
    return None if record is None else (record.rank, exit_words(record.exitcode))


def split_errors(errors: Sequence[Outcome], *, peer_died: bool,
                 ) -> tuple[list[Outcome], list[Outcome]]:
    """(primary, collateral) error outcomes of one cell, each in rank order.

    A rank whose own outcome is an error caused it. Its error is collateral only when
    its message says a peer went away *and* there is such a peer: one that died, or an
    earlier error of another rank whose message is its own. A case that raises
    "Timed out waiting for ..." with every peer alive is that rank's error.
    """
    ordered = sorted(errors, key=lambda o: o.end_time)
    causes = [o for o in ordered if not COLLATERAL.search(o.message)]
    primary: list[Outcome] = []
    collateral: list[Outcome] = []
    for o in ordered:
        earlier = any(c is not o and c.rank != o.rank and c.end_time <= o.end_time
                      for c in causes)
        looks = COLLATERAL.search(o.message) is not None
        (collateral if looks and (peer_died or earlier) else primary).append(o)
    if not primary:  # only echoes of a death we cannot place: report them all
        primary, collateral = collateral, []
    return sorted(primary, key=lambda o: o.rank), sorted(collateral, key=lambda o: o.rank)


def merge_evidence(per_rank: Sequence[dict[str, Any]], *, ranks: Sequence[int] | None = None,
                   failing: Sequence[int] = ()) -> dict[str, Any]:
    """One value per key when all ranks agree; else ``key@rankN`` per differing rank.

    ``ranks``: the rank of each entry (default 0, 1, ...). A failed cell (``failing``
    ranks given) labels every value the ranks do not all share, failing ranks first: a
    passing rank's number never stands unlabelled for the cell.

    >>> merge_evidence([{"err": 0.0}, {"err": 1.0}], failing=[1])
    {'err@rank1': 1.0, 'err@rank0': 0.0}
    """
    numbers = list(ranks) if ranks is not None else list(range(len(per_rank)))
    merged: dict[str, Any] = {}
    keys: list[str] = []
    for ev in per_rank:
        for k in ev:
            if k not in keys:
                keys.append(k)
    order = sorted(range(len(numbers)), key=lambda i: numbers[i] not in failing)
    for k in keys:
        values = [ev.get(k) for ev in per_rank]
        present = [v for v in values if v is not None]
        if all(v == present[0] for v in present) and len(present) == len(values):
            merged[k] = present[0]
        elif failing:
            for i in order:
                if values[i] is not None:
                    merged[f"{k}@rank{numbers[i]}"] = values[i]
        else:
            if values[0] is not None:
                merged[k] = values[0]
            for r, v in zip(numbers, values, strict=True):
                if v is not None and (r != numbers[0] and v != values[0]):
                    merged[f"{k}@rank{r}"] = v
    return merged


def result_from_outcomes(entry: Entry, outcomes: Sequence[Outcome], *,
                         tails: dict[int, str], extra_msg: str = "",
                         peer_died: bool = False) -> Result:
    """The cell's result from the outcomes its ranks wrote (every rank, or those that did)."""
    errors = [o for o in outcomes if not o.ok]
    ordered = sorted(outcomes, key=lambda o: o.rank)
    evidence = merge_evidence([o.evidence for o in ordered], ranks=[o.rank for o in ordered],
                              failing=[o.rank for o in errors])
    duration = max(o.duration_s for o in outcomes)
    case_s = max(o.case_s for o in outcomes)
    if not errors:
        return Result(cell_id=entry.cell.id, status=Status.PASSED, evidence=evidence,
                      duration_s=duration, case_s=case_s, attempts=entry.attempt,
                      mutant=entry.mutant, out_dir=entry.out_dir,
                      reads=merge_reads([o.reads for o in outcomes]))
    primary, collateral = split_errors(errors, peer_died=peer_died)
    failures = tuple(RankFailure(rank=o.rank, message=o.message, traceback=o.traceback,
                                 check=o.check) for o in primary + collateral)
    msg = extra_msg
    if collateral:
        note = (f"rank(s) {', '.join(str(o.rank) for o in collateral)} failed only "
                "because a peer left the collective")
        msg = f"{msg}; {note}" if msg else note
    return Result(
        cell_id=entry.cell.id, status=Status.FAILED, kind=FailureKind.ERROR,
        failing_ranks=tuple(o.rank for o in primary), failures=failures,
        stderr_tails=tails, evidence=evidence, duration_s=duration, case_s=case_s,
        attempts=entry.attempt, message=msg, mutant=entry.mutant, out_dir=entry.out_dir,
    )
