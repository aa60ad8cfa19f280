"""A run put together, the same way for every front: :func:`assemble`.

Place (the cells that fit here, the worlds, the pack, the durations: :func:`place_cells`),
prepare (runner, sources, cache: :func:`~cpmatrix.supervise.setup.prepare_run`), plan
(:func:`~cpmatrix.plan.plan.make_plan`, once: the run executes it as given), schedule
(the scheduler's runner and pool), and the
:class:`~cpmatrix.supervise.context.RunContext` made once from all of it, with the
recorded histories read once (:class:`~cpmatrix.supervise.sharding.Recorded`). What
differs between ``cpmatrix run``, ``repro`` and the pytest front is a :class:`Front`; the
executors (one per kind of cell) are the front's to hand down, as ``executors``.
``--dry-run`` places and plans alike and prints the plan
(:func:`cpmatrix.supervise.pipeline.plan_only`).

Example::

    run = assemble(options, matrix, cells, claim, scheduler_for(options),
                   Recorded(options, claim.path), Front(repro=("--matrix", "m.yaml")),
                   executors=EXECUTORS)
    report = run.run(Watch())
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cpmatrix.cache.key import ActionKeys
from cpmatrix.matrix.schema import Cell, Matrix, Platform
from cpmatrix.plan.packing import PackSpec
from cpmatrix.plan.plan import Placement, Plan, make_plan
from cpmatrix.supervise.context import RunContext
from cpmatrix.supervise.executors.base import Executor
from cpmatrix.supervise.executors.spare import Spare
from cpmatrix.supervise.options import RunOptions
from cpmatrix.supervise.outdir import OutClaim
from cpmatrix.supervise.run_report import RunReport
from cpmatrix.supervise.schedulers import Scheduler
from cpmatrix.supervise.session import JobPool, Known, Watch, run_cells
from cpmatrix.supervise.setup import (
    PreparedRun,
    devices_for,
    make_context,
    pack_spec,
    prepare_run,
)
from cpmatrix.supervise.sharding import Recorded

__all__ = ["Assembled", "Front", "assemble", "place_cells"]


@dataclass(frozen=True)
class Front:
    """What differs between the fronts' runs; everything else is assembled alike."""

    #: The flags a failing cell's repro line carries after its id (None: no line).
    repro: tuple[str, ...] | None = None
    #: The scheduler places the worlds, packed by ``--pack``/``--world-ranks`` (``repro``:
    #: its cells in one world here, packed by the defaults, whatever those flags say).
    scheduled: bool = True
    #: A Slurm split weighs the worlds by the recorded durations (the pytest front's by
    #: its cells alone).
    weighed: bool = True
    #: A launcher started before the plan, for the first world that fits (the pytest
    #: front's, started while it collects: :mod:`cpmatrix.supervise.executors.spare`).
    spare: Spare | None = None
    #: ``repro --mutant``: the one cell's runs, unmutated first (a mutant is judged only
    #: against a green cell); None: the matrix's own mutants (``--mutants``) or none.
    mutants: Mapping[str, Sequence[str]] | None = None
    #: The cells this host cannot run are reported ``skipped`` (``repro`` says them
    #: before the run instead, and reports none).
    report_skipped: bool = True


@dataclass(frozen=True)
class Assembled:
    """A run made whole before it starts: the prepared cells, their plan (made once),
    the run's context (made once), the job pool and what is known of the cells."""

    prepared: PreparedRun
    plan: Plan[Executor]
    context: RunContext
    pool: JobPool
    known: Known
    #: A line saying where the worlds run ("" for this host).
    note: str = ""

    def run(self, watch: Watch) -> RunReport:
        """The plan, run as given (:func:`~cpmatrix.supervise.session.run_cells`)."""
        return run_cells(self.plan, self.prepared.platforms, self.context, pool=self.pool,
                         known=self.known, watch=watch)


def place_cells(options: RunOptions, cells: Sequence[Cell],
                platforms: Mapping[str, Platform], *, scheduler: Scheduler,
                recorded: Recorded, executors: Sequence[Executor], front: Front) -> Placement:
    """What the plan of ``cells`` is made from, the same for a run and ``--dry-run``: the
    cells that fit this host's devices (the rest skipped, with why), the worlds the
    scheduler splits them into, how a world packs them, and the durations it packs by."""
    devices, fits, skipped, needs = devices_for(cells, platforms, options,
                                                executors=executors)
    pack, worlds = PackSpec(), 1  # repro: its cells in one world, packed by the defaults
    if front.scheduled:
        # A cuda world packs every GPU of its host (under Slurm: of its node, --gpus).
        pack = pack_spec(options, platforms.values(), devices=devices, scheduler=scheduler)
        worlds = scheduler.worlds(fits, recorded.durations if front.weighed else dict)
    return Placement(cells=tuple(fits), skipped=tuple(skipped), devices=devices,
                     needs_devices=needs, worlds=worlds, pack=pack,
                     durations=recorded.planning(pack), settings=options.planning,
                     longest_first=front.scheduled and scheduler.longest_first)


def assemble(options: RunOptions, matrix: Matrix, cells: Sequence[Cell], claim: OutClaim,
             scheduler: Scheduler, recorded: Recorded, front: Front, *,
             executors: Sequence[Executor], keys: ActionKeys | None = None,
             selection: Sequence[Cell] | None = None, order: str = "") -> Assembled:
    """The one way every front's run is put together: place (:func:`place_cells`), prepare
    (runner, sources, cache: :func:`~cpmatrix.supervise.setup.prepare_run`), plan
    (:func:`~cpmatrix.plan.plan.make_plan`), schedule, and the :class:`RunContext` made
    once from all of it, and what is known of the cells
    (:class:`~cpmatrix.supervise.session.Known`) once: nothing is changed after. ``executors``:
    the registry the front handed down, one executor per kind of cell."""
    placement = place_cells(options, cells, {p.name: p for p in matrix.platforms},
                            scheduler=scheduler, recorded=recorded, executors=executors,
                            front=front)
    prepared = prepare_run(options, matrix, list(cells), placement, claim, keys=keys,
                           selection=selection, order=order, scheduler=scheduler,
                           executors=executors)
    plan = make_plan(executors, placement, cached=prepared.cached,
                     mutants=prepared.mutants if front.mutants is None else front.mutants,
                     report_skipped=front.report_skipped)
    runner, pool, note = prepared.runner, JobPool(devices=placement.devices), ""
    if front.scheduled:
        scheduling = scheduler.schedule(prepared.runner, prepared.out,
                                        devices=placement.devices)
        runner, pool, note = scheduling.runner, scheduling.pool, scheduling.note
    context = make_context(matrix, prepared.out, runner, options, claim.run_id,
                           sources=prepared.sources, order=order, pack=placement.pack,
                           durations=placement.durations, repro=front.repro,
                           spare=front.spare)
    known = Known(cached=prepared.cached, store=prepared.store, recorded=recorded.merged())
    return Assembled(prepared=prepared, plan=plan, context=context, pool=pool, known=known,
                     note=note)
