"""Telling a cell's peers at once that this rank is done with a test they may wait in.

When a test fails (or skips) on one rank, its peers may be blocked in a gloo collective
the failing rank will never join. Natively torch's harness ends them as soon as the
failing process exits; here the ranks live on, so the failing rank *cuts* the cell
(:func:`cut_peers`): it writes its word in the world's store, then shuts down its gloo
connections (every established TCP socket of the process but the store's). A peer
blocked on one of them gets gloo's "Connection closed by peer" at once, and, seeing the
word (:func:`cut_by_peer`), knows it was cut off rather than failed: its report of that
phase is not its own verdict (:mod:`cpmatrix.kinds.pytest.rank_session`). The world survives:
after the cell every rank of it sees the cut (:func:`was_cut`) and makes its group
afresh for the next cell, so no world restarts for a failing test.

Only on gloo: an nccl collective does not end when a socket closes (the supervisor's
grace period and teardown stay the answer there). Linux only (``/proc``); elsewhere
:func:`cut_peers` cuts nothing and the grace period applies.

Imports the standard library and the protocol's key names (the store is handed in by
the world's rank).

Example::

    >>> cut_key(3, 1), done_key(3, 0)
    ('cpmatrix/3/cut/r1', 'cpmatrix/3/done/r0')
"""

from __future__ import annotations

import datetime
import os
import re
import socket
from dataclasses import dataclass
from typing import Any, Final

from cpmatrix.worker.protocol import cut_key, done_key

__all__ = ["CUT_OFF", "Armed", "arm", "armed", "cut_by_peer", "cut_key", "cut_peers",
           "disarm", "done", "done_key", "peers_done", "was_cut"]

#: What a collective raises on a rank whose peer closed its connections.
CUT_OFF: Final = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe",
                            re.IGNORECASE)
#: TCP state ``ESTABLISHED`` in ``/proc/net/tcp``.
_ESTABLISHED: Final = "01"




@dataclass(frozen=True, slots=True)
class Armed:
    """The cell this rank runs now, and where its peers read the words."""

    store: Any
    index: int
    rank: int
    size: int
    #: The store's port: its connections are never cut.
    store_port: int


_ARMED: list[Armed] = []


def arm(store: Any, index: int, rank: int, size: int, store_port: int) -> None:
    """Before cell ``index`` runs on this rank (gloo worlds only)."""
    _ARMED[:] = [Armed(store, index, rank, size, store_port)]


def disarm() -> None:
    """After the cell: nothing is cut on its behalf any more."""
    _ARMED.clear()


def armed() -> Armed | None:
    """The cell armed now (None: cutting is not available)."""
    return _ARMED[0] if _ARMED else None


def done() -> None:
    """This rank's test of the armed cell ended (its peers may stop waiting for it)."""
    a = armed()
    if a is not None:
        a.store.set(done_key(a.index, a.rank), "1")


def peers_done(wait_s: float) -> bool:
    """Whether every peer's test of the armed cell ended, waiting up to ``wait_s``."""
    a = armed()
    if a is None:
        return True
    keys = [done_key(a.index, r) for r in range(a.size) if r != a.rank]
    try:
        a.store.wait(keys, datetime.timedelta(seconds=wait_s))
    except Exception:  # the store's timeout: a peer is still in the test
        return False
    return True


def cut_peers() -> int:
    """Cut the armed cell: the word first (a peer's error after it is a cut), then this
    process's gloo connections. Returns how many connections were shut down (never
    raises for a connection that went away meanwhile)."""
    a = armed()
    if a is None or a.size < 2:
        return 0
    a.store.set(cut_key(a.index, a.rank), "1")
    shut = 0
    for fd in _connections(exclude_port=a.store_port):
        try:
            # (gloo may close a connection meanwhile: the fd is then gone, or no socket)
            sock = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            sock.shutdown(socket.SHUT_RDWR)
            shut += 1
        except OSError:
            pass
        finally:
            sock.detach()  # the fd stays gloo's: it closes it when its group goes
    return shut


def cut_by_peer() -> bool:
    """Whether another rank of the armed cell cut it."""
    a = armed()
    if a is None:
        return False
    return any(a.store.check([cut_key(a.index, r)]) for r in range(a.size) if r != a.rank)


def was_cut(store: Any, index: int, size: int) -> bool:
    """Whether any rank cut cell ``index`` (its groups are then made afresh)."""
    return any(store.check([cut_key(index, r)]) for r in range(size))


def _connections(*, exclude_port: int) -> list[int]:
    """The fds of this process's established TCP connections, but the store's."""
    sockets: dict[int, int] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return []
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            sockets[int(target[8:-1])] = int(name)
    out: list[int] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _ESTABLISHED:
                continue
            inode = int(fields[9])
            local = int(fields[1].rsplit(":", 1)[1], 16)
            remote = int(fields[2].rsplit(":", 1)[1], 16)
            if inode in sockets and exclude_port not in (local, remote):
                out.append(sockets[inode])
    return out
