"""One launched world, many cells at once: each cell's process group is its own.

A world is launched with as many ranks as its plan needs (one world per platform; the
plan is :mod:`cpmatrix.plan.packing`'s). Cell ``i`` runs on the world ranks
``placement[i]`` in a default process group of exactly those ranks, numbered
``0..k-1`` in that order, so a case sees what it would see in a world of its own size:
``dist.get_world_size() == k``, ``dist.get_rank()`` its rank in the cell, a mesh over
every rank of the group, derived meshes (slicing, ``_flatten``) whose ``new_group``
calls involve only the cell's ranks. Cells on disjoint ranks run at the same time, each
in its own group; a rank that is in no running cell waits for its next one.

Before a cell, its ranks agree through the launcher's store (never a collective: the
group does not exist yet), each writing its word
(:class:`~cpmatrix.worker.protocol.store.Ready`, ``<go|stop>:<group id>``):

- any ``stop`` (a rank whose process state could not be restored after an earlier cell
  runs nothing more) -> every rank of the cell skips it (the supervisor reruns it in a
  fresh world);
- every rank already holds the same clean group, made for exactly these ranks -> it is
  reused (a group costs 10-300 ms to make);
- else each rank destroys the group it holds and they make a new one from the store
  under a prefix of this cell's own, so a group never meets a peer of an earlier one.

Every rank of the cell reads the same keys, so they all take the same decision.

Example::

    >>> SubWorld.decide(["go:3", "go:3"], held=3, held_ranks=(4, 5), ranks=(4, 5))
    'reuse'
    >>> SubWorld.decide(["go:3", "go:-1"], held=3, held_ranks=(4, 5), ranks=(4, 5))
    'new'
    >>> SubWorld.decide(["go:3", "stop:3"], held=3, held_ranks=(4, 5), ranks=(4, 5))
    'skip'
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any, Literal

from cpmatrix.worker.protocol import Ready, group_prefix, ready_key

__all__ = ["SubWorld"]

Decision = Literal["reuse", "new", "skip"]


class SubWorld:
    """The default process group of this rank's current cell; re-made when its ranks change."""

    def __init__(self, *, rank: int, backend: str, store: Any, timeout: datetime.timedelta,
                 device: str = "cpu") -> None:
        self.rank = rank
        self.backend = backend
        self.store = store
        self.timeout = timeout
        self.device = device
        #: Index of the cell whose agreement made the group this rank holds (-1: none).
        self.held = -1
        #: World ranks of the held group, in group-rank order.
        self.held_ranks: tuple[int, ...] = ()
        #: A cell on the held group failed: its collectives may be out of step.
        self.dirty = False

    @staticmethod
    def decide(values: Sequence[str], *, held: int, held_ranks: tuple[int, ...],
               ranks: tuple[int, ...]) -> Decision:
        """The decision every rank of a cell takes from the same agreement values."""
        words = [Ready.decode(v) for v in values]
        if any(w is None or not w.go for w in words):
            return "skip"
        if {w.held for w in words if w is not None} == {held} and held >= 0 \
                and held_ranks == ranks:
            return "reuse"
        return "new"

    def agree(self, index: int, ranks: tuple[int, ...], *, stop: bool,
              wait: datetime.timedelta) -> Decision:
        """Write this rank's word for cell ``index`` and read its peers' (store only)."""
        local = ranks.index(self.rank)
        held = -1 if self.dirty else self.held
        self.store.set(ready_key(index, local), Ready(go=not stop, held=held).encode())
        if stop:
            return "skip"
        keys = [ready_key(index, r) for r in range(len(ranks))]
        self.store.wait(keys, wait)
        values = [self.store.get(k).decode() for k in keys]
        return self.decide(values, held=held, held_ranks=self.held_ranks, ranks=ranks)

    def switch(self, index: int, ranks: tuple[int, ...], forget: Callable[[], None]) -> None:
        """Drop the held group and make cell ``index``'s over ``ranks`` with its peers.

        ``forget`` drops what lives on the old group (cached meshes, DTensor caches)
        before it is destroyed.
        """
        import torch.distributed as dist

        forget()
        if dist.is_initialized():
            dist.destroy_process_group()
        self.held, self.held_ranks, self.dirty = -1, (), False
        local, size = ranks.index(self.rank), len(ranks)
        # What a case reads of its world (RANK, WORLD_SIZE, ...) is set at the start of
        # every cell, reused group or not: cpmatrix.worker.cellenv.
        dist.init_process_group(
            backend=self.backend,
            store=dist.PrefixStore(  # type: ignore[attr-defined]  # public, not in stubs
                group_prefix(index), self.store),
            rank=local, world_size=size, timeout=self.timeout)
        self.held, self.held_ranks = index, ranks
