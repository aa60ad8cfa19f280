"""One launched world, many cell sizes: the process group a cell runs in is its own.

A world is launched with as many ranks as its largest cell needs (one world per
platform). A cell of ``k`` ranks runs on ranks ``0..k-1`` in a default process group of
exactly ``k`` ranks, so a case sees what it would see in a world of its own size:
``dist.get_world_size() == k``, a mesh over every rank of the group, derived meshes
(slicing, ``_flatten``) whose ``new_group`` calls involve only the cell's ranks. The
other ranks sit the cell out, waiting at the supervisor barrier.

Switching size destroys the current group (and the meshes on it) on every rank and
re-creates it on the ranks the next cell needs, from the launcher's store under a
prefix of its own: a group never meets a peer of an earlier group. The planner orders a
world's cells by size, so a world switches at most once per size (about 10-300 ms each,
see docs/worlds.md).

Example::

    >>> SubWorld.prefix(7)
    'cpmatrix/pg7/'
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from typing import Any

__all__ = ["SubWorld"]


class SubWorld:
    """The default process group of the cells of one size; re-made when the size changes."""

    def __init__(self, *, rank: int, backend: str, store: Any,
                 timeout: datetime.timedelta) -> None:
        self.rank = rank
        self.backend = backend
        self.store = store
        self.timeout = timeout
        #: Ranks of the current group (0: none yet).
        self.size = 0

    @staticmethod
    def prefix(index: int) -> str:
        """The store prefix of the group made for cell ``index`` (unique in the world)."""
        return f"cpmatrix/pg{index}/"

    def member(self) -> bool:
        """This rank runs the current size's cells (else it sits them out)."""
        return self.rank < self.size

    def switch(self, size: int, index: int, forget: Callable[[], None]) -> bool:
        """Make the group of ``size`` ranks current; False when it already was.

        ``forget`` drops what lives on the old group (cached meshes, DTensor caches)
        before it is destroyed. Every rank of the world calls this for every cell, in
        the same order, so the members create their group together.
        """
        if size == self.size:
            return False
        import torch.distributed as dist

        forget()
        if dist.is_initialized():
            dist.destroy_process_group()
        self.size = size
        # What a case reads of its world, as torchrun would have set it for `size` ranks.
        os.environ["WORLD_SIZE"] = os.environ["LOCAL_WORLD_SIZE"] = str(size)
        if self.rank < size:
            dist.init_process_group(
                backend=self.backend,
                store=dist.PrefixStore(  # type: ignore[attr-defined]  # public, not in stubs
                    self.prefix(index), self.store),
                rank=self.rank, world_size=size, timeout=self.timeout)
        return True
