"""What a cell's ranks say to each other through the launcher's store (never a collective).

The launcher hosts a TCPStore (torchrun's agent store, or the fork launcher's); the ranks
of a cell use it twice per cell, each rank under keys of its own:

- **before** the cell, a :class:`Ready` word under :func:`ready_key`: ``go:<held>`` (the
  index of the cell whose agreement made the group the rank holds, -1 for none) or
  ``stop:<held>`` (the rank runs no more cells); the group is then made under
  :func:`group_prefix` (:mod:`cpmatrix.worker.subworld`);
- **after** it, a :class:`PeerReport` under :func:`report_key`: the rank's status
  (``ok``, ``error``, or ``recycle``: the process state cannot be restored) and what it did
  to its groups (:mod:`cpmatrix.worker.exchange`, :mod:`cpmatrix.worker.hygiene`).

Standard library only.

Example::

    >>> ready_key(7, 1), report_key(7, 1), group_prefix(7)
    ('cpmatrix/7/ready/r1', 'cpmatrix/7/r1', 'cpmatrix/pg7/')
    >>> Ready(go=True, held=3).encode(), Ready.decode("stop:-1")
    ('go:3', Ready(go=False, held=-1))
    >>> PeerReport.decode(PeerReport(status=RECYCLE, groups={}).encode()).status
    'recycle'
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from cpmatrix.worker.protocol.records import ERROR, OK

__all__ = ["RECYCLE", "PeerReport", "PeerStatus", "Ready", "cut_key", "done_key",
           "group_prefix", "ready_key", "report_key"]

#: A rank's status of a cell for its peers: the outcome's (``ok``/``error``), or
#: ``recycle``: the cell changed what cannot be restored, the rank runs no more cells.
PeerStatus = Literal["ok", "error", "recycle"]
RECYCLE: Final = "recycle"
_GO: Final = "go"
_STOP: Final = "stop"


def ready_key(index: int, rank: int) -> str:
    """The key of rank ``rank``'s (its rank in the cell) :class:`Ready` word for cell
    ``index``."""
    return f"cpmatrix/{index}/ready/r{rank}"


def report_key(index: int, rank: int) -> str:
    """The key of rank ``rank``'s :class:`PeerReport` after cell ``index``."""
    return f"cpmatrix/{index}/r{rank}"


def cut_key(index: int, rank: int) -> str:
    """The key rank ``rank`` (in the cell) sets when it cut cell ``index``.

    >>> cut_key(3, 1)
    'cpmatrix/3/cut/r1'
    """
    return f"cpmatrix/{index}/cut/r{rank}"


def done_key(index: int, rank: int) -> str:
    """The key rank ``rank`` sets when its test of cell ``index`` ended."""
    return f"cpmatrix/{index}/done/r{rank}"


def group_prefix(index: int) -> str:
    """The store prefix of the process group made for cell ``index`` (unique in the
    world: a group never meets a peer of an earlier one)."""
    return f"cpmatrix/pg{index}/"


@dataclass(frozen=True, slots=True)
class Ready:
    """A rank's word before a cell: run it (``go``) or not (``stop``), and the group it
    holds (the index of the cell that made it; -1: none or not reusable)."""

    go: bool
    held: int

    def encode(self) -> str:
        return f"{_GO if self.go else _STOP}:{self.held}"

    @classmethod
    def decode(cls, value: str) -> Ready | None:
        """The word, or None when ``value`` is not one (read as ``stop`` by callers)."""
        word, sep, held = value.partition(":")
        if not sep or word not in (_GO, _STOP):
            return None
        try:
            return cls(go=word == _GO, held=int(held))
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class PeerReport:
    """What a rank tells its cell's peers after the cell: its status and its group report
    (:meth:`cpmatrix.worker.hygiene.GroupLedger.after_case`)."""

    status: PeerStatus
    groups: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> str:
        return json.dumps({"s": self.status, "r": self.groups})

    @classmethod
    def decode(cls, raw: str | bytes) -> PeerReport:
        """The report; an unreadable one is an ``error`` with no groups (never ``ok``)."""
        try:
            value = json.loads(raw)
            status, groups = str(value["s"]), dict(value["r"])
        except (ValueError, KeyError, TypeError):
            return cls(status=ERROR)
        if status not in (OK, ERROR, RECYCLE):
            return cls(status=ERROR)
        return cls(status=status, groups=groups)  # type: ignore[arg-type]

    @property
    def ok(self) -> bool:
        return self.status == OK
