"""The plan's packing is computed once and executed as given.

The planner packs each batch (:func:`cpmatrix.plan.batches.plan_batches`); the session hands
that packing to the batch's job, which places its cells by it and never packs them again
(only cells a job hands back after a fault are packed anew, for the world they get).
The packer is counted: a job that packs its planned cells again fails the test.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from cpmatrix.kinds.executors import EXECUTORS
from cpmatrix.kinds.world.job import WorldRun
from cpmatrix.matrix.schema import Cell, Mesh, Platform
from cpmatrix.plan import packing as packing_module
from cpmatrix.plan.packing import PackSpec, pack
from cpmatrix.plan.plan import Placement, make_plan
from cpmatrix.plan.settings import PlanSettings
from cpmatrix.supervise.context import RunContext
from cpmatrix.supervise.entry import Entry
from cpmatrix.supervise.runners import get_runner
from cpmatrix.supervise.session import JobPool, _queue, _Session

PLATFORM = Platform(name="cpu", backend="gloo", device="cpu")


def _cell(i: int, mesh: str) -> Cell:
    return Cell(id=f"t{i}[unit,{mesh},fp64,autocast=off,reference]@cpu", target="t",
                case="m:f", kind="parity", level="unit", mesh=Mesh.parse(mesh), dtype="fp64",
                autocast=False, path="reference", params=(), platform="cpu", timeout_s=60,
                tags=())


CELLS = [_cell(i, m) for i, m in enumerate(["1x1", "1x2", "1x4", "1x1", "1x2", "1x1", "1x3"])]
#: Recorded seconds, so that the packing's order is not the cells' order.
DURATIONS = {c.id: float(1 + (i * 7) % 5) for i, c in enumerate(CELLS)}


class _NotStarted:
    """Stands in for the job the session would start: the test only looks at the plan."""

    def __init__(self, job: Any) -> None:
        self.job = job

    def start(self) -> None:
        pass


@pytest.fixture
def packed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every packing computed (its cell count)."""
    calls: list[int] = []

    def counted(widths: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(widths))
        return pack(widths, *args, **kwargs)

    monkeypatch.setattr(packing_module, "pack", counted)
    return calls


def test_each_batch_is_packed_once_and_its_world_runs_that_packing(
        tmp_path: Path, packed: list[int]) -> None:
    spec = PackSpec(ranks=(("cpu", 4),))
    context = RunContext(out_root=tmp_path, runner=get_runner("local"), run_id="r",
                         pack=spec, durations=DURATIONS)
    started: list[_NotStarted] = []

    def hold(job: Any) -> Any:
        started.append(_NotStarted(job))
        return started[-1]

    pool = JobPool(jobs=8, wrap_job=hold)
    session = _Session(context, {"cpu": PLATFORM}, pool=pool, store=None, on_result=None)
    plan = make_plan(EXECUTORS, Placement(cells=tuple(CELLS), worlds=2, pack=spec,
                                          durations=DURATIONS,
                                          settings=PlanSettings(batch_size=4)))
    once = [len(b.cells) for _, bs in plan.batches for b in bs]
    assert packed == once  # the plan: once per batch
    _queue(session, plan)
    assert packed == once, "the session packed the plan's batches again"
    items = list(session.queue)
    planned = [i.packing for i in items]
    assert all(p is not None for p in planned) and len(planned) >= 2
    while session.queue:
        assert session._launch_next()
    assert packed == once, "a job packed its planned cells again"
    for item, p, held in zip(items, planned, started, strict=True):
        assert p is not None
        world: WorldRun = held.job
        assert world.entries == [item.entries[i] for i in p.order]
        assert world.placement == [p.slots[i].ranks for i in p.order]
        assert world.world_size == p.ranks


def test_a_world_runs_the_packing_it_is_given(tmp_path: Path, packed: list[int]) -> None:
    # A serial packing handed to a world whose run packs in slots: the world runs it.
    context = RunContext(out_root=tmp_path, runner=get_runner("local"), run_id="r",
                         pack=PackSpec(ranks=(("cpu", 4),)))
    entries = [Entry(cell=c) for c in CELLS[:3]]
    given = PackSpec(serial=True).plan("cpu", [e.cell.world_size for e in entries],
                                       [1.0, 1.0, 1.0])
    own = context.pack.plan("cpu", [e.cell.world_size for e in entries], [1.0, 1.0, 1.0])
    assert (own.slots, own.order) != (given.slots, given.order)  # (the test can tell)
    world = WorldRun("000-w", entries, PLATFORM, context, packing=given)
    assert packed == [3, 3]
    assert world.world_size == given.ranks == 4
    assert world.placement == [given.slots[i].ranks for i in given.order]
    # Without one (cells handed back after a fault), the world packs them itself.
    again = WorldRun("001-w", entries, PLATFORM, context)
    assert packed == [3, 3, 3]
    assert again.entries[0].cell.world_size == 4  # widest first


def test_keep_order_packs_one_cell_at_a_time_through_the_runs_pack() -> None:
    """``--keep-order`` (matrix order, one cell at a time, to bisect a state leak) is said
    once, by the run's pack (``setup.pack_spec``: ``serial``), and the plan follows it."""
    from cpmatrix.supervise.options import RunOptions
    from cpmatrix.supervise.schedulers import scheduler_for
    from cpmatrix.supervise.setup import pack_spec

    options = RunOptions(keep_order=True)
    spec = pack_spec(options, [PLATFORM], devices=0, scheduler=scheduler_for(options))
    assert spec.serial
    plan = make_plan(EXECUTORS, Placement(cells=tuple(CELLS), pack=spec, durations=DURATIONS,
                                          settings=options.planning))
    batches = [b for _, bs in plan.batches for b in bs]
    assert sum(len(b.cells) for b in batches) == len(CELLS)
    # One cell at a time: no two slots of a batch overlap in time.
    for b in batches:
        assert b.packing is not None
        spans = sorted((s.start, s.end) for s in b.packing.slots)
        assert all(one[1] <= two[0] for one, two in pairwise(spans)), spans


def test_the_plan_leaves_out_the_cached_cells_unless_mutants_are_judged() -> None:
    """A cached cell is served from the cache, not planned; with mutants it runs (a mutant
    is judged against its cell run here). Skipped cells stay the placement's,
    reported unless the front says them itself."""
    wide = (CELLS[2], "wider than the GPUs")
    placement = Placement(cells=tuple(CELLS), skipped=(wide,), durations=DURATIONS,
                          settings=PlanSettings(runs=2))
    cached = {CELLS[0].id, CELLS[3].id}
    plan = make_plan(EXECUTORS, placement, cached=cached)
    planned = [c.id for _, bs in plan.batches for b in bs for c in b.cells]
    assert [c.id for c in plan.cached] == [CELLS[0].id, CELLS[3].id]
    assert sorted(planned) == sorted(2 * [c.id for c in CELLS if c.id not in cached])
    assert plan.skipped == (wide,) and plan.runs == 2 and plan.cells == tuple(CELLS)
    assert [ex.name for ex, _ in plan.batches] == [ex.name for ex in EXECUTORS]

    judged = make_plan(EXECUTORS, placement, cached=cached, mutants={CELLS[0].id: ["bug"]},
                       report_skipped=False)
    assert judged.cached == () and judged.skipped == ()
    assert CELLS[0].id in {c.id for _, bs in judged.batches for b in bs for c in b.cells}


@pytest.mark.parametrize("longest_first", [False, True])
def test_the_session_queues_the_batches_in_the_plans_launch_order(
        tmp_path: Path, longest_first: bool) -> None:
    """The launch order is the plan's (longest expected first where the scheduler's slots
    take the longest world left, as Slurm's do; else the planners' order): the session
    queues it as given and orders nothing itself."""
    context = RunContext(out_root=tmp_path, runner=get_runner("local"), run_id="r",
                         durations=DURATIONS)
    plan = make_plan(EXECUTORS, Placement(cells=tuple(CELLS), worlds=3, durations=DURATIONS,
                                          settings=PlanSettings(batch_size=1),
                                          longest_first=longest_first))
    flat = [b for _, bs in plan.batches for b in bs]
    expected = sorted(flat, key=lambda b: -b.expected_s) if longest_first else flat
    assert [b.name for _, b in plan.launches] == [b.name for b in expected]
    assert sorted(flat, key=lambda b: -b.expected_s) != flat  # the two orders differ here
    session = _Session(context, {"cpu": PLATFORM}, pool=JobPool(jobs=2), store=None,
                       on_result=None)
    _queue(session, plan)
    assert [i.batch for i in session.queue] == [b.name for b in expected]
