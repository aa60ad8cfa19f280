"""Every cell of a world starts from the same process state (runs inside the ranks).

Cells of a world share a Python process, so whatever a case changes reaches the next
cell unless it is put back. :class:`CellIsolation` snapshots the state once, when the
world starts, and after every cell puts back what it can and reports what it cannot
(the cell fails with check ``process_state`` and its ranks run no more cells: the cells
after it rerun in a fresh world). What it covers is an inventory, not a guess:

- the table of process-wide settings (:mod:`cpmatrix.worker.inventory`: torch's modes,
  dtypes, flags, autocast, threads, flush-denormal; numpy's error state; the
  interpreter's recursion limit, signal handlers, warnings filters, hooks, ...);
- module namespaces, classes and ``sys.modules`` (:mod:`cpmatrix.worker.namespaces`);
- child processes the cell left: ended (SIGKILL, reaped) when the cell ends; a forked
  child that came back out of the case into cpmatrix fails the cell
  (:mod:`cpmatrix.worker.forks`);
- threads the cell started and left running (not daemon threads): detected; a thread
  cannot be stopped from outside;
- ``faulthandler`` (cpmatrix's own crash reporter): re-enabled on the rank's log.

The per-cell environment, working folder, ``HOME`` and ``TMPDIR`` are set at the start of
each cell (:mod:`cpmatrix.worker.cellenv`), process groups are checked by
:mod:`cpmatrix.worker.hygiene`, and the RNGs are reseeded from the cell id before each
cell.

Imports only the standard library at import time; torch is imported by the worker.

Example (inside the worker)::

    iso = CellIsolation(project_roots=("/repo/tests/cases",), log=log_file)
    for cell in cells:
        iso.before_cell()
        run(cell)
        problems = iso.after_cell(world_dir, index, rank)  # restored; problems: recycle
"""

from __future__ import annotations

import faulthandler
import os
import threading
import time
from collections.abc import Sequence
from typing import TextIO

from cpmatrix.worker.forks import strays
from cpmatrix.worker.inventory import Inventory, settings
from cpmatrix.worker.namespaces import NamespaceWatch
from cpmatrix.worker.procs import children, descendants, kill_all, reap_orphans

__all__ = ["CellIsolation", "end_children"]

#: How long threads a cell left may take to finish before they count as left running.
_THREAD_GRACE_S = 0.2


def end_children() -> int:
    """SIGKILL and reap every child of this process (what the cell left); how many."""
    found = children()
    if found is None:
        found = descendants(os.getpid())
    if not found:
        return 0
    for _ in range(3):  # a killed child's own children come back to us (subreaper)
        kill_all(found)
        reap_orphans()
        found = children() or []
        if not found:
            break
    return len(found)


class CellIsolation:
    """Snapshot at world start; :meth:`after_cell` restores and reports what it cannot."""

    def __init__(self, project_roots: Sequence[str], log: TextIO | None = None,
                 namespaces: NamespaceWatch | None = None) -> None:
        self.log = log
        self.inventory = Inventory(settings())
        #: Taken before the fork where the fork launcher runs the world (the same in
        #: every rank), else here.
        self.namespaces = namespaces or NamespaceWatch(project_roots)
        self._threads: set[int] = set()
        #: Seconds each part of the last :meth:`after_cell` took (``--profile``).
        self.timings: dict[str, float] = {}

    def before_cell(self) -> None:
        self.namespaces.before_cell()
        self._threads = {t.ident or 0 for t in threading.enumerate()}

    def after_cell(self, world_dir: str, index: int, rank: int) -> tuple[list[str], list[str]]:
        """Restore the world-start state. Returns (what could not be restored: the ranks
        are recycled, what the cell did wrong that is fully undone: it fails only)."""
        t0 = time.perf_counter()
        end_children()
        failed = strays(world_dir, index, rank)
        if self.log is not None and not faulthandler.is_enabled():
            faulthandler.enable(file=self.log, all_threads=True)
        t1 = time.perf_counter()
        # Settings first: a mode left entered would intercept what the watch reads.
        problems = self.inventory.after_cell()
        t2 = time.perf_counter()
        problems += self.namespaces.after_cell()
        t3 = time.perf_counter()
        problems += self._threads_left()
        self.timings = {"children": t1 - t0, "settings": t2 - t1, "namespaces": t3 - t2,
                        "threads": time.perf_counter() - t3}
        return problems, failed

    def _threads_left(self) -> list[str]:
        left = [t for t in threading.enumerate()
                if (t.ident or 0) not in self._threads and not t.daemon and t.is_alive()]
        deadline = time.monotonic() + _THREAD_GRACE_S
        for t in left:
            t.join(max(0.0, deadline - time.monotonic()))
        left = [t for t in left if t.is_alive()]
        if not left:
            return []
        names = ", ".join(t.name for t in left[:5])
        return [f"the case left {len(left)} thread(s) running ({names}): a thread cannot be "
                "stopped from outside, and would run on during the next cells"]
