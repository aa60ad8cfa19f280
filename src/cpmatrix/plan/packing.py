"""Packing a world's cells onto its ranks: several cells at once on disjoint rank sets.

A world launches ``ranks`` ranks (on a GPU host, one per device). A cell of ``k`` ranks
takes any ``k`` of them for as long as it runs, in a process group of exactly its own
ranks (:mod:`cpmatrix.worker.subworld`), so cells on disjoint rank sets run at once: a
9-rank world runs a 2x2, a 2x2 and a 1x1 cell side by side, an 8-GPU node four 2-GPU
cells. Pure; no processes, no torch.

The schedule is list scheduling of rigid jobs, simulated on the expected durations:
whenever ranks are free, the highest-priority cell that fits starts on the lowest free
ranks (priority: the input order; the planner's is widest first, then longest first,
``cpmatrix run --order`` gives another; a narrow cell fills the ranks a wide one leaves
idle). ``serial`` places every cell on ranks ``0..k-1``, one after another: one cell
at a time, in the input order, as worlds ran before slots.

What runs is the plan's **order**, not its clock: every rank runs its own cells in the
order of their planned start, and a cell starts once all of its ranks reach it. Any two
cells sharing a rank are run in the same order by every rank they share, so a world
cannot deadlock, whatever the real durations are (the earliest unfinished cell always
has all of its ranks waiting for it).

Example::

    >>> p = pack([4, 4, 1], [2.0, 2.0, 1.0], ranks=9)
    >>> [(s.ranks, s.start) for s in p.slots]
    [((0, 1, 2, 3), 0.0), ((4, 5, 6, 7), 0.0), ((8,), 0.0)]
    >>> p.makespan, p.order
    (2.0, (0, 1, 2))
    >>> s = pack([4, 4, 1], [2.0, 2.0, 1.0], ranks=9, serial=True)
    >>> [(x.ranks, x.start) for x in s.slots], s.makespan
    ([((0, 1, 2, 3), 0.0), ((0, 1, 2, 3), 2.0), ((0,), 4.0)], 5.0)
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PackSpec", "Packing", "Slot", "pack", "rank_span"]


@dataclass(frozen=True, slots=True)
class PackSpec:
    """A run's packing policy: slots or serial, and how many ranks each world launches.

    ``ranks`` maps a platform to the ranks of its worlds (``--world-ranks``; on a GPU host
    the GPUs the world holds); a world launches at least its widest cell's ranks and
    never more than its cells can use at once.

    >>> spec = PackSpec(ranks=(("cuda", 8),))
    >>> spec.world_ranks("cuda", [2, 2, 2, 2, 2]), spec.world_ranks("cuda", [2, 2])
    (8, 4)
    >>> spec.world_ranks("cpu", [4, 9, 1])
    9
    """

    serial: bool = False
    ranks: tuple[tuple[str, int], ...] = ()
    #: Platforms whose cells stay in one world whatever ``--jobs`` says (a GPU host's:
    #: one world packs every device).
    whole: tuple[str, ...] = ()
    #: The cells' priority is the order they are given in (``--order``), not widest and
    #: longest first; and planned without recorded durations, so that the same order
    #: gives the same placement on every run.
    ordered: bool = False

    def world_ranks(self, platform: str, widths: Sequence[int]) -> int:
        """Ranks a world of cells of ``widths`` on ``platform`` launches."""
        widest = max(widths, default=1)
        want = dict(self.ranks).get(platform, 0)
        return max(widest, min(want, sum(widths)))

    def plan(self, platform: str, widths: Sequence[int], expected: Sequence[float]) -> Packing:
        """The packing of one world's cells (in the planner's priority order)."""
        return pack(widths, expected, self.world_ranks(platform, widths), serial=self.serial)


@dataclass(frozen=True, slots=True)
class Slot:
    """Where and when (expected) one cell runs: its world ranks, in its own rank order."""

    ranks: tuple[int, ...]
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Packing:
    """The cells' slots (parallel to the input) and the order the world runs them in."""

    ranks: int
    slots: tuple[Slot, ...]
    #: Input indices by planned start: the order every rank runs its own cells in.
    order: tuple[int, ...]

    @property
    def makespan(self) -> float:
        """Expected seconds from the first cell's start to the last cell's end."""
        return max((s.end for s in self.slots), default=0.0)

    @property
    def work(self) -> float:
        """Expected rank-seconds of the cells (width x duration, summed)."""
        return sum(len(s.ranks) * (s.end - s.start) for s in self.slots)

    @property
    def busy(self) -> float:
        """The share of the world's rank-seconds the cells use (1.0: no rank idles)."""
        total = self.ranks * self.makespan
        return self.work / total if total > 0 else 1.0

    @property
    def concurrency(self) -> int:
        """The most cells the plan runs at once."""
        events = sorted([(s.start, 1) for s in self.slots if s.end > s.start]
                        + [(s.end, -1) for s in self.slots if s.end > s.start])
        most = now = 0
        for _, step in events:
            now += step
            most = max(most, now)
        return max(most, 1 if self.slots else 0)


def pack(widths: Sequence[int], expected: Sequence[float], ranks: int, *,
         serial: bool = False) -> Packing:
    """Slots for cells of ``widths`` ranks lasting ``expected`` seconds, on ``ranks`` ranks.

    The input order is the priority (the planner's: widest, then longest first); ties in
    the planned start keep it. ``ValueError`` for a cell wider than the world.

    >>> pack([], [], ranks=4).makespan
    0.0
    >>> pack([2, 1, 1, 1], [3.0, 1.0, 1.0, 1.0], ranks=3).slots[3]
    Slot(ranks=(2,), start=2.0, end=3.0)
    """
    if len(widths) != len(expected):
        raise ValueError("widths and expected durations differ in length")
    for w in widths:
        if not 1 <= w <= ranks:
            raise ValueError(f"a cell of {w} ranks does not fit a world of {ranks}")
    slots = _serial(widths, expected) if serial else _list_schedule(widths, expected, ranks)
    order = tuple(sorted(range(len(slots)), key=lambda i: (slots[i].start, i)))
    return Packing(ranks=ranks, slots=tuple(slots), order=order)


def _serial(widths: Sequence[int], expected: Sequence[float]) -> list[Slot]:
    slots, now = [], 0.0
    for w, d in zip(widths, expected, strict=True):
        slots.append(Slot(ranks=tuple(range(w)), start=now, end=now + max(d, 0.0)))
        now += max(d, 0.0)
    return slots


def _list_schedule(widths: Sequence[int], expected: Sequence[float],
                   ranks: int) -> list[Slot]:
    """Event-driven greedy: at each moment ranks free up, start the highest-priority
    cells that fit (the first in the input order among those that fit, repeatedly; with
    the planner's widest-first order that is the widest fitting width's first cell)."""
    # Cells of each width in priority order; the widths, widest first.
    queues: dict[int, list[int]] = {}
    for i, w in enumerate(widths):
        queues.setdefault(w, []).append(i)
    heads = {w: 0 for w in queues}
    by_width = sorted(queues, reverse=True)
    placed: list[Slot | None] = [None] * len(widths)
    free = list(range(ranks))  # kept sorted: the lowest free ranks are taken first
    running: list[tuple[float, int, tuple[int, ...]]] = []  # (end, index, ranks)
    now, left = 0.0, len(widths)
    while left:
        started = True
        while started:
            started = False
            # The highest priority among cells that fit: the earliest in the input order
            # of each fitting width's next cell. A cell that is next in the order but
            # does not fit never blocks a narrower one.
            best: int | None = None
            for w in by_width:
                if w <= len(free) and heads[w] < len(queues[w]):
                    head = queues[w][heads[w]]
                    best = head if best is None or head < best else best
            if best is not None:
                w = widths[best]
                heads[w] += 1
                mine, free = tuple(free[:w]), free[w:]
                end = now + max(expected[best], 0.0)
                placed[best] = Slot(ranks=mine, start=now, end=end)
                heapq.heappush(running, (end, best, mine))
                left -= 1
                started = True
        if not running:
            break
        # Advance to the next end; every cell ending then frees its ranks.
        now = running[0][0]
        while running and running[0][0] <= now:
            _, _, mine = heapq.heappop(running)
            free = sorted(free + list(mine))
    slots = [s for s in placed if s is not None]
    assert len(slots) == len(widths), "every cell fits the world, so every cell is placed"
    return slots


def rank_span(ranks: Sequence[int]) -> str:
    """``0-3`` for consecutive ranks, else a comma list.

    >>> rank_span((0, 1, 2, 3)), rank_span((4,)), rank_span((1, 5, 6))
    ('0-3', '4', '1,5,6')
    """
    rs = list(ranks)
    if len(rs) > 1 and rs == list(range(rs[0], rs[0] + len(rs))):
        return f"{rs[0]}-{rs[-1]}"
    return ",".join(map(str, rs))
