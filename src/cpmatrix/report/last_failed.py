"""The cells that did not pass when they last ran in an output folder: ``last-failed.json``.

``cpmatrix repro --failed`` reruns them. The record is pytest's ``--lf`` cache for one
output folder, kept from run to run (as ``durations.json``; a run's claim does not
remove it). Every run in the folder updates it from its results, and only from the
cells it ran:

- a cell that ran and passed (or was a cached pass, or a killed mutant) leaves it;
- a cell that ran and did not pass (failed, crash, timeout, flaky, infra, a survived or
  not judged mutant) enters it, or stays with this run's status;
- a cell the run did not select, skipped, or did not reach (``interrupted``: a signal,
  ``-x``/``--maxfail``) keeps what it had.

So "the last run's failures" are, cell by cell, the failures of the last run that ran
the cell: a later ``run -k other``, a run that selected nothing (exit 3), a dry run or
one stopped before a cell never hides an earlier failure, and a pass always clears it.

Example::

    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp())
    >>> a = Result(cell_id="a", status=Status.FAILED)
    >>> update_last_failed(out, [a, Result(cell_id="b", status=Status.FAILED)], at=1.0)
    >>> update_last_failed(out, [Result(cell_id="b", status=Status.PASSED)], at=2.0)
    >>> [(e.cell_id, e.status, e.at) for e in read_last_failed(out)]
    [('a', 'failed', 1.0)]
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cpmatrix.fsutil import atomic_write_json
from cpmatrix.layout import RunLayout
from cpmatrix.result import Result, Status, testcase_name

__all__ = ["FailedEntry", "read_last_failed", "update_last_failed"]

#: Statuses that say nothing of the cell's code: the record keeps what it had.
_NOT_RUN: Final = (Status.SKIPPED, Status.INTERRUPTED)
_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class FailedEntry:
    """A cell (or a mutant run of it) that did not pass when it last ran, and when."""

    cell_id: str
    mutant: str
    status: str
    at: float


def read_last_failed(out: Path) -> list[FailedEntry] | None:
    """The record of ``out`` (oldest failure first); None when no run wrote one.
    A damaged file is ``ValueError`` naming it (never an empty list: that would say
    nothing failed)."""
    path = RunLayout(out).last_failed
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot be read ({exc})") from None
    try:
        entries = [FailedEntry(cell_id=str(e["cell_id"]), mutant=str(e.get("mutant", "")),
                               status=str(e["status"]), at=float(e["at"]))
                   for e in data["cells"].values()]
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"{path}: not a last-failed record ({exc!r})") from None
    return sorted(entries, key=lambda e: e.at)


def update_last_failed(out: Path, results: Iterable[Result], *, at: float) -> None:
    """Fold one run's ``results`` into ``out``'s record (the rules above); written
    atomically, and only when it changes. An unreadable record is started afresh."""
    try:
        known = read_last_failed(out) or []
    except ValueError:
        known = []
    cells: dict[str, dict[str, Any]] = {
        testcase_name(e.cell_id, e.mutant): {"cell_id": e.cell_id, "mutant": e.mutant,
                                             "status": e.status, "at": e.at}
        for e in known}
    before = json.dumps(cells, sort_keys=True)
    for r in results:
        name = testcase_name(r.cell_id, r.mutant)
        if r.status in _NOT_RUN:
            continue
        if r.status.ok:
            cells.pop(name, None)
        else:
            cells[name] = {"cell_id": r.cell_id, "mutant": r.mutant,
                           "status": r.status.value, "at": round(at, 3)}
    if json.dumps(cells, sort_keys=True) != before or not RunLayout(out).last_failed.exists():
        atomic_write_json(RunLayout(out).last_failed, {"version": _VERSION, "cells": cells})
