"""The packing of a world's cells onto its ranks (plan/packing.py), and the agreement its
ranks reach before each cell (worker/subworld.py).

The properties a world relies on, for any cells: no rank runs two cells at once in the
plan; and, the one that matters at run time, executing the plan's *order* with any real
durations (each rank runs its cells in order, a cell starts once all of its ranks reach
it) never deadlocks.
"""

from __future__ import annotations

import heapq
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpmatrix.plan.packing import Packing, PackSpec, pack
from cpmatrix.worker.subworld import SubWorld


def cells_and_ranks() -> st.SearchStrategy[tuple[list[int], list[float], int]]:
    @st.composite
    def build(draw: st.DrawFn) -> tuple[list[int], list[float], int]:
        ranks = draw(st.integers(1, 12))
        n = draw(st.integers(0, 40))
        widths = [draw(st.integers(1, ranks)) for _ in range(n)]
        times = [draw(st.floats(0.0, 50.0, allow_nan=False)) for _ in range(n)]
        # The planner's priority: widest first, then longest first.
        order = sorted(range(n), key=lambda i: (-widths[i], -times[i]))
        return [widths[i] for i in order], [times[i] for i in order], ranks
    return build()


def overlaps(p: Packing) -> list[tuple[int, int, int]]:
    """(cell, cell, rank) for two cells planned on one rank at the same time."""
    bad = []
    for i, a in enumerate(p.slots):
        for j, b in enumerate(p.slots[:i]):
            if a.start < b.end and b.start < a.end and a.end > a.start and b.end > b.start:
                bad += [(j, i, r) for r in set(a.ranks) & set(b.ranks)]
    return bad


def execute(p: Packing, durations: list[float]) -> float | None:
    """Run the plan's order as the world does, with ``durations`` as the real times;
    the makespan, or None on a deadlock (some cell can never start)."""
    queue = {r: [i for i in p.order if r in p.slots[i].ranks] for r in range(p.ranks)}
    free_at = dict.fromkeys(range(p.ranks), 0.0)
    done: set[int] = set()
    events: list[tuple[float, int]] = []
    pending = set(range(len(p.slots)))
    while pending:
        # Start every cell whose ranks all have it first in their queues.
        started = False
        for i in sorted(pending):
            ranks = p.slots[i].ranks
            if all(queue[r] and queue[r][0] == i for r in ranks):
                start = max(free_at[r] for r in ranks)
                end = start + durations[i]
                for r in ranks:
                    queue[r].pop(0)
                    free_at[r] = end
                heapq.heappush(events, (end, i))
                pending.discard(i)
                started = True
        if not started and not events:
            return None
        if events:
            _, i = heapq.heappop(events)
            done.add(i)
    return max(free_at.values(), default=0.0)


@settings(max_examples=300, deadline=None)
@given(cells_and_ranks(), st.randoms(use_true_random=False))
def test_any_plan_is_sound_and_never_deadlocks_whatever_the_real_durations(
        case: tuple[list[int], list[float], int], rnd: random.Random) -> None:
    widths, times, ranks = case
    for serial in (False, True):
        p = pack(widths, times, ranks, serial=serial)
        assert sorted(p.order) == list(range(len(widths)))
        for i, s in enumerate(p.slots):
            assert len(s.ranks) == widths[i] == len(set(s.ranks))
            assert all(0 <= r < ranks for r in s.ranks)
            assert s.end - s.start == pytest.approx(times[i])
        assert overlaps(p) == []
        starts = [p.slots[i].start for i in p.order]
        assert starts == sorted(starts)
        work = sum(w * t for w, t in zip(widths, times, strict=True))
        assert p.makespan >= max(times, default=0.0) - 1e-9
        assert p.makespan >= work / ranks - 1e-6
        assert p.makespan <= sum(times) + 1e-6  # never slower than one cell at a time
        real = [rnd.uniform(0.0, 3.0) * t + rnd.uniform(0.0, 1.0) for t in times]
        assert execute(p, real) is not None, "the world would deadlock"


@settings(max_examples=200, deadline=None)
@given(cells_and_ranks(), st.randoms(use_true_random=False))
def test_any_priority_order_is_sound_and_never_deadlocks(
        case: tuple[list[int], list[float], int], rnd: random.Random) -> None:
    """``--order`` hands the packer any order (reverse, shuffled): still no rank runs two
    cells at once, and the world never deadlocks."""
    widths, times, ranks = case
    order = list(range(len(widths)))
    rnd.shuffle(order)
    widths, times = [widths[i] for i in order], [times[i] for i in order]
    p = pack(widths, times, ranks)
    assert overlaps(p) == []
    real = [rnd.uniform(0.0, 3.0) * t + rnd.uniform(0.0, 1.0) for t in times]
    assert execute(p, real) is not None, "the world would deadlock"


def test_the_first_cell_in_the_order_that_fits_starts_first() -> None:
    # Narrow first: the 1-rank cells take ranks 0 and 1, the 4-rank cell waits for them
    # (the planner's widest-first order would start the 4-rank cell first).
    p = pack([1, 1, 4], [1.0, 2.0, 1.0], 4)
    assert [(s.ranks, s.start) for s in p.slots] == [((0,), 0.0), ((1,), 0.0),
                                                     ((0, 1, 2, 3), 2.0)]
    assert p.order == (0, 1, 2)
    # A cell that does not fit the free ranks never blocks a later one that does.
    q = pack([3, 3, 1], [1.0, 1.0, 1.0], 4)
    assert [s.start for s in q.slots] == [0.0, 1.0, 0.0]


def test_serial_is_one_cell_at_a_time_on_the_first_ranks() -> None:
    p = pack([4, 2, 1], [1.0, 2.0, 3.0], 9, serial=True)
    assert [(s.ranks, s.start) for s in p.slots] == [
        ((0, 1, 2, 3), 0.0), ((0, 1), 1.0), ((0,), 3.0)]
    assert (p.makespan, p.concurrency) == (6.0, 1)


def test_narrow_cells_fill_the_ranks_a_wide_cell_leaves_idle() -> None:
    # The CPU matrix's shape: a 6-rank cell on 9 ranks leaves 3 for 2- and 1-rank cells.
    p = pack([6, 2, 1, 1], [4.0, 2.0, 2.0, 2.0], 9)
    assert [s.start for s in p.slots] == [0.0, 0.0, 0.0, 2.0]
    assert set(p.slots[1].ranks) | set(p.slots[2].ranks) == {6, 7, 8}
    assert p.makespan == 4.0 and p.concurrency == 3


def test_an_eight_gpu_host_keeps_every_gpu_busy() -> None:
    """The issue's case: on 8 devices, four 2-GPU cells at once, and a mix of widths
    packed so that no device idles while work is left that fits it."""
    p = pack([2, 2, 2, 2], [5.0] * 4, 8)
    assert p.concurrency == 4 and p.makespan == 5.0 and p.busy == 1.0
    widths = [8] + [4] * 4 + [2] * 8 + [1] * 16
    mixed = pack(widths, [3.0] * len(widths), 8)
    assert mixed.busy == 1.0
    assert mixed.makespan == pytest.approx(sum(w * 3.0 for w in widths) / 8)


def test_a_cell_wider_than_the_world_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit a world of 2"):
        pack([3], [1.0], 2)


def test_pack_spec_world_ranks() -> None:
    spec = PackSpec(ranks=(("cuda", 8), ("cpu", 16)))
    assert spec.world_ranks("cuda", [1, 1]) == 2  # never more than the cells can use
    assert spec.world_ranks("cuda", [4, 4, 4]) == 8
    assert spec.world_ranks("cpu", [9]) == 9
    assert spec.world_ranks("other", [3, 1]) == 3  # absent: the widest cell's
    assert PackSpec(ranks=(("cpu", 2),)).world_ranks("cpu", [4]) == 4  # never narrower


@pytest.mark.parametrize(("values", "held", "held_ranks", "ranks", "want"), [
    (["go:5", "go:5"], 5, (2, 3), (2, 3), "reuse"),
    (["go:5", "go:5"], 5, (2, 3), (3, 2), "new"),  # same ranks, other order: new group
    (["go:5", "go:4"], 5, (2, 3), (2, 3), "new"),
    (["go:-1", "go:-1"], -1, (), (2, 3), "new"),  # nobody holds a group yet
    (["go:5", "go:-1"], 5, (2, 3), (2, 3), "new"),  # a peer's group is dirty
    (["stop:5", "go:5"], 5, (2, 3), (2, 3), "skip"),
    (["go:5", "stop:-1"], 5, (2, 3), (2, 3), "skip"),
])
def test_every_rank_of_a_cell_takes_the_same_decision(
        values: list[str], held: int, held_ranks: tuple[int, ...], ranks: tuple[int, ...],
        want: str) -> None:
    assert SubWorld.decide(values, held=held, held_ranks=held_ranks, ranks=ranks) == want
