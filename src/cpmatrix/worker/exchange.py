"""After a cell: the store exchange of its ranks' statuses, and failing a cell for state.

Standard library only (the store is torch's, handed in).

Example (inside the worker)::

    peers = exchange(store, index, rank, size, timeout_s, PeerReport(status=OK, groups=report))
    outcome = blame_state(outcome, ["the case left ..."], recycle=True)
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from cpmatrix.result import SHARED_CHECK, STATE_CHECK
from cpmatrix.worker.protocol import ERROR, Outcome, PeerReport, report_key

__all__ = ["blame_state", "exchange"]


def exchange(store: Any, index: int, rank: int, size: int, timeout_s: float,
             mine: PeerReport) -> dict[int, PeerReport]:
    """Wait until every rank of cell ``index`` (``rank``: this one's in the cell) wrote
    its outcome; every rank's report, by rank in the cell.

    ``mine``: this rank's status (``ok``, ``error`` or ``recycle``: the process state
    cannot be restored) and what it did to its groups
    (:meth:`cpmatrix.worker.hygiene.GroupLedger.after_case`). All the cell's ranks read
    the same keys, so they take the same decisions.

    Uses the rendezvous TCPStore, never a collective: a collective here could be
    matched with one a peer is still blocked in inside the case.
    """
    import datetime as _dt

    store.set(report_key(index, rank), mine.encode())
    keys = [report_key(index, r) for r in range(size)]
    store.wait(keys, _dt.timedelta(seconds=timeout_s))
    return {r: PeerReport.decode(store.get(key)) for r, key in enumerate(keys)}


def blame_state(outcome: Outcome, problems: list[str], *, recycle: bool) -> Outcome:
    """Fail the cell that changed what it must leave as it was (check
    :data:`STATE_CHECK` when the world is recycled after it, else :data:`SHARED_CHECK`)."""
    message = "process_state: " + "; ".join(problems)
    after = "the world is recycled after this cell" if recycle else "it is not reused"
    print(f"cpmatrix worker: cell {outcome.id} on rank {outcome.rank}: {message}; {after}",
          file=sys.stderr)
    check = STATE_CHECK if recycle else SHARED_CHECK
    if outcome.ok:
        return dataclasses.replace(outcome, status=ERROR, exc_type="ProcessStateError",
                                   message=message, traceback="", check=check,
                                   recycle=recycle or outcome.recycle)
    # Keep the case's own error first; the state problem is part of the story (and a
    # shared thing broken outweighs a state change alone).
    kept = SHARED_CHECK if outcome.check == STATE_CHECK and not recycle else outcome.check
    return dataclasses.replace(outcome, message=f"{outcome.message}; {message}",
                               check=kept, recycle=recycle or outcome.recycle)
