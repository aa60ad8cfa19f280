"""A run put together, the same way for every front: :func:`assemble`.

Prepare (devices, runner, sources, cache: :func:`~cpmatrix.supervise.setup.prepare_run`), pack
(:func:`~cpmatrix.supervise.setup.pack_spec`), schedule (the scheduler's runner, pool and world
split), and the :class:`~cpmatrix.supervise.context.RunContext` made once from all of it, with
the recorded histories read once (:class:`~cpmatrix.supervise.sharding.Recorded`). What differs
between ``cpmatrix run``, ``repro`` and the pytest front is a :class:`Front`; the
executors (one per kind of cell) are the front's to hand down, as ``executors``.

Example::

    run = assemble(options, matrix, cells, claim, scheduler_for(options),
                   Recorded(options, claim.path), Front(repro=("--matrix", "m.yaml")),
                   executors=EXECUTORS)
    report = run.run(options, Watch())
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cpmatrix.cache.key import ActionKeys
from cpmatrix.matrix.schema import Cell, Matrix
from cpmatrix.plan.packing import PackSpec
from cpmatrix.supervise.context import RunContext
from cpmatrix.supervise.executors.base import Executor
from cpmatrix.supervise.executors.spare import Spare
from cpmatrix.supervise.options import RunOptions
from cpmatrix.supervise.outdir import OutClaim
from cpmatrix.supervise.run_report import RunReport
from cpmatrix.supervise.schedulers import Scheduler
from cpmatrix.supervise.session import JobPool, Known, Watch, run_cells
from cpmatrix.supervise.setup import PreparedRun, make_context, pack_spec, prepare_run
from cpmatrix.supervise.sharding import Recorded

__all__ = ["Assembled", "Front", "assemble"]


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
    """A run made whole before it starts: the prepared cells, the run's context (made
    once), the job pool, what is known of the cells, and the executors that run them."""

    prepared: PreparedRun
    context: RunContext
    pool: JobPool
    known: Known
    executors: Sequence[Executor]
    #: A line saying where the worlds run ("" for this host).
    note: str = ""

    def run(self, options: RunOptions, watch: Watch) -> RunReport:
        """The cells, run (:func:`~cpmatrix.supervise.session.run_cells`)."""
        return run_cells(self.prepared.cells, self.prepared.platforms, self.context,
                         executors=self.executors, plan=options.planning, pool=self.pool,
                         known=self.known, watch=watch)


def assemble(options: RunOptions, matrix: Matrix, cells: Sequence[Cell], claim: OutClaim,
             scheduler: Scheduler, recorded: Recorded, front: Front, *,
             executors: Sequence[Executor], keys: ActionKeys | None = None,
             selection: Sequence[Cell] | None = None, order: str = "") -> Assembled:
    """The one way every front's run is put together: prepare (devices, runner, sources,
    cache: :func:`~cpmatrix.supervise.setup.prepare_run`), pack, schedule, and the
    :class:`RunContext` made once from all of it, and what is known of the cells
    (:class:`~cpmatrix.supervise.session.Known`) once: nothing is changed after. ``executors``:
    the registry the front handed down, one executor per kind of cell."""
    prepared = prepare_run(options, matrix, list(cells), claim, keys=keys,
                           selection=selection, order=order, scheduler=scheduler,
                           executors=executors)
    # A cuda world packs every GPU of its host (under Slurm: of its node, --gpus).
    pack = pack_spec(options, prepared.platforms.values(), devices=prepared.devices,
                     scheduler=scheduler) if front.scheduled else PackSpec()
    runner, pool, note = prepared.runner, JobPool(devices=prepared.devices), ""
    if front.scheduled:
        scheduling = scheduler.schedule(
            prepared.runner, prepared.out, prepared.cells, devices=prepared.devices,
            durations=recorded.durations if front.weighed else dict)
        runner, pool, note = scheduling.runner, scheduling.pool, scheduling.note
    context = make_context(matrix, prepared.out, runner, options, claim.run_id,
                           sources=prepared.sources, order=order, pack=pack,
                           durations=recorded.planning(pack), repro=front.repro,
                           spare=front.spare)
    known = Known(cached=prepared.cached, store=prepared.store,
                  mutants=prepared.mutants if front.mutants is None else front.mutants,
                  skipped=prepared.skipped if front.report_skipped else (),
                  recorded=recorded.merged())
    return Assembled(prepared=prepared, context=context, pool=pool, known=known,
                     executors=executors, note=note)
