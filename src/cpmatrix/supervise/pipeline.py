"""The run's front door: claim -> shard -> order -> place -> prepare -> plan -> schedule ->
run -> report -> cache, for every front (``cpmatrix run``/``spill``, ``repro``, the pytest plugin).

``cpmatrix run`` is the stages of :data:`RUN_STAGES`; every front's run is put together
by one function, :func:`cpmatrix.supervise.assembly.assemble` (place, prepare, plan,
schedule, the :class:`~cpmatrix.supervise.context.RunContext` made once); what differs
between the fronts is a :class:`~cpmatrix.supervise.assembly.Front`. ``--dry-run`` places
and plans as a run does (:func:`~cpmatrix.supervise.assembly.place_cells`,
:func:`~cpmatrix.plan.plan.make_plan`) and prints the plan. docs/architecture.md ("A run's
stages") draws the whole.

A front parses its input into :class:`~cpmatrix.supervise.options.RunOptions` and the selected
cells, calls one function here with the executors it runs cells by (the registry,
:data:`cpmatrix.kinds.executors.EXECUTORS`: built above the core, handed down here, so
the core names no kind), and prints what it is told through its :class:`Hooks`
(the lines of the run, its progress, its summary). Nothing else of the run is the
front's business: :func:`execute` returns the exit code, :func:`reproduce` a one-cell
run, :func:`execute_cells` the pytest plugin's run, :func:`plan_only` the dry run.

Example::

    class Console:            # a Hooks: say/warn print; start/result/done show progress
        ...

    code = execute(options, lambda: Chosen(matrix=matrix, cells=cells), Console(),
                   executors=EXECUTORS)
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, Protocol

from cpmatrix.cache.key import ActionKeys
from cpmatrix.cache.layers import remote_settings
from cpmatrix.cache.provenance import cell_digests, run_source
from cpmatrix.errors import ExitCode
from cpmatrix.matrix.schema import Cell, Matrix, Platform
from cpmatrix.plan.ordering import Order, arrange, failed_first, parse_order
from cpmatrix.plan.plan import Placement, make_plan
from cpmatrix.report.last_failed import read_last_failed, update_last_failed
from cpmatrix.result import Result
from cpmatrix.supervise.assembly import Assembled, Front, assemble, place_cells
from cpmatrix.supervise.entry import Entry
from cpmatrix.supervise.executors.base import Executor
from cpmatrix.supervise.executors.spare import Spare
from cpmatrix.supervise.options import RunOptions
from cpmatrix.supervise.outdir import OutClaim, claim_out
from cpmatrix.supervise.run_report import RunReport
from cpmatrix.supervise.schedulers import Scheduler, scheduler_for
from cpmatrix.supervise.session import Watch
from cpmatrix.supervise.setup import PreparedRun
from cpmatrix.supervise.sharding import Recorded, take_shard, write_empty_report
from cpmatrix.supervise.stopping import Stopper, StopRequested, exit_code_for, stop_on_signals

__all__ = ["Chosen", "Entry", "Hooks", "ReproHooks", "Reproduced", "RunReport", "check_options",
           "execute", "execute_cells", "plan_only", "reproduce"]


class Hooks(Protocol):
    """What a front shows of a run: its lines (stdout, stderr), progress, summary."""

    def say(self, line: str) -> None:
        """A line of the run's own output (stdout)."""

    def warn(self, line: str) -> None:
        """A warning or an error (stderr)."""

    def start(self, total: int) -> None:
        """The run starts ``total`` cells."""

    def result(self, entry: Entry, result: Result) -> None:
        """One cell's result, as it comes."""

    def done(self) -> None:
        """The cells are all in (or the run stopped): progress ends."""

    def summary(self, report: RunReport, out: Path) -> None:
        """The run's summary, after its report and cache lines."""

    def launched(self, name: str, what: str, cells: int) -> None:
        """A job (``what``: a world, the spill compiler) started for ``cells`` cells."""


@dataclass(frozen=True)
class Chosen:
    """The selection a front made: the matrix and its selected cells (or why none)."""

    matrix: Matrix
    cells: list[Cell]
    #: What to say when ``cells`` is empty (exit 3).
    nothing: str = ""
    #: The flags a failing cell's repro line carries after its id (None: no line).
    repro: tuple[str, ...] | None = None


@dataclass(frozen=True)
class _Narrowed:
    """The cells this run (shard) runs, in their order; the whole selection's keys."""

    cells: list[Cell]
    selection: list[Cell]
    keys: ActionKeys
    order: Order | None


def execute(options: RunOptions, choose: Callable[[], Chosen], hooks: Hooks, *,
            executors: Sequence[Executor]) -> int:
    """Run what ``choose`` selects (``--dry-run``: plan it) by ``executors`` (one per
    kind of cell) and return the exit code: the stages of :data:`RUN_STAGES`, in order,
    until one returns an exit code.

    ``choose`` runs after ``--out`` is claimed (locked; nothing is deleted): the last
    run's evidence makes way only once this run has cells to run (``prepare_run``), so a
    spec error (exit 2) or an empty selection (exit 3) leaves it whole.
    """
    scheduler = scheduler_for(options)
    scheduler.preflight()
    with nullcontext() if options.dry_run else _claimed(options) as claim:
        out = Path(options.out).resolve() if claim is None else claim.path
        run = _Run(options=options, hooks=hooks, scheduler=scheduler, claim=claim,
                   choose=choose, recorded=Recorded(options, out), executors=executors)
        for stage in RUN_STAGES:
            outcome = stage(run)
            if isinstance(outcome, int):
                return outcome
            run = outcome
    raise AssertionError("the last stage returns the exit code")


@dataclass(frozen=True, kw_only=True)
class _Run:
    """``cpmatrix run`` as far as its stages have taken it (each stage adds its part)."""

    options: RunOptions
    hooks: Hooks
    scheduler: Scheduler
    #: ``--out``, claimed (None: ``--dry-run``, which writes nothing).
    claim: OutClaim | None
    choose: Callable[[], Chosen]
    recorded: Recorded
    #: The executors the front handed down, one per kind of cell.
    executors: Sequence[Executor]
    chosen: Chosen | None = None
    narrowed: _Narrowed | None = None
    assembled: Assembled | None = None
    report: RunReport | None = None
    #: The signal that stopped the run, if one did.
    signum: int | None = None


def _select(run: _Run) -> _Run | int:
    """The front's selection (exit 3 when it is empty)."""
    chosen = run.choose()
    if not chosen.cells:
        run.hooks.warn(chosen.nothing)
        return ExitCode.NOTHING_SELECTED
    return replace(run, chosen=chosen)


def _narrow_stage(run: _Run) -> _Run | int:
    """``--shard``, ``--order``, ``--failed-first`` (:func:`_narrow`)."""
    assert run.chosen is not None
    narrowed = _narrow(run.options, run.chosen, run.recorded, run.claim, run.hooks)
    return narrowed if isinstance(narrowed, int) else replace(run, narrowed=narrowed)


def _check_remote(run: _Run) -> _Run:
    """A bad ``remote_cache:`` is exit 2, ``--dry-run`` too."""
    assert run.chosen is not None
    remote_settings(run.options.caching, run.chosen.matrix)
    return run


def _dry_run(run: _Run) -> _Run | int:
    """``--dry-run`` ends here, with the plan printed (:func:`plan_only`)."""
    if run.claim is not None:
        return run
    assert run.chosen is not None and run.narrowed is not None
    return plan_only(run.narrowed.cells, {p.name: p for p in run.chosen.matrix.platforms},
                     run.options, run.hooks, scheduler=run.scheduler,
                     recorded=run.recorded, executors=run.executors)


def _assemble_stage(run: _Run) -> _Run:
    """The run put together (:func:`assemble`), its repro lines the front's."""
    assert run.claim is not None and run.chosen is not None and run.narrowed is not None
    narrowed = run.narrowed
    return replace(run, assembled=assemble(
        run.options, run.chosen.matrix, narrowed.cells, run.claim, run.scheduler,
        run.recorded, Front(repro=run.chosen.repro), executors=run.executors,
        keys=narrowed.keys,
        selection=narrowed.selection, order=str(narrowed.order or "")))


def _run_stage(run: _Run) -> _Run:
    """The cells run; report.html, the cache's uploads, the summary (:func:`_run_assembled`)."""
    assert run.assembled is not None
    report, signum = _run_assembled(run.options, run.assembled, run.hooks)
    return replace(run, report=report, signum=signum)


def _exit_stage(run: _Run) -> int:
    """0, 1, 3, or the stopping signal's code (:func:`_exit_code`)."""
    assert run.report is not None and run.assembled is not None
    return _exit_code(run.report, run.signum, run.assembled.plan.placement, run.hooks)


#: ``cpmatrix run``'s stages, in order, as nox runs its tasks: each takes the run as far
#: as it got and returns it grown, or the exit code that ends it there.
RUN_STAGES: Final[tuple[Callable[[_Run], _Run | int], ...]] = (
    _select, _narrow_stage, _check_remote, _dry_run, _assemble_stage, _run_stage, _exit_stage)


@contextmanager
def _assembled(options: RunOptions, matrix: Matrix, cells: Sequence[Cell], front: Front,
               executors: Sequence[Executor]) -> Iterator[Assembled]:
    """A run of exactly ``cells`` (``repro``, the pytest front: no stage list, no shard,
    no order), put together by :func:`assemble` while ``--out`` is claimed; the scheduler
    is picked before the claim, as :func:`execute` does."""
    scheduler = scheduler_for(options)
    with _claimed(options) as claim:
        yield assemble(options, matrix, cells, claim, scheduler,
                       Recorded(options, claim.path), front, executors=executors)


@contextmanager
def _claimed(options: RunOptions) -> Iterator[OutClaim]:
    """``--out`` claimed for this run (:func:`cpmatrix.supervise.outdir.claim_out`) while it
    runs; released after, whatever happened."""
    claim = claim_out(Path(options.out))
    try:
        yield claim
    finally:
        claim.release()


def _narrow(options: RunOptions, chosen: Chosen, recorded: Recorded, claim: OutClaim | None,
            hooks: Hooks) -> _Narrowed | int:
    """``--shard``'s part of the selection (its manifest written), in ``--order``; an
    exit code when the shard is empty."""
    cells = selection = chosen.cells
    keys = ActionKeys(search_path=chosen.matrix.pythonpath)
    if options.shard is not None:
        out = recorded.out
        cells, manifest = take_shard(cells, options.shard, recorded.durations())
        hooks.say(f"shard {manifest.shard}/{manifest.of}: {len(manifest.cells)} of "
                  f"{len(manifest.all_cells)} cells")
        if claim is not None:
            claim.take_over()  # a shard, even an empty one, is a run: its report replaces
            manifest.write(out)
            if not cells:  # more shards than cells: an empty report, not a failure
                write_empty_report(out, claim.run_id, source={
                    **run_source(chosen.matrix.path, keys).to_dict(),
                    "cells": cell_digests(selection, keys)})
                return ExitCode.OK
        elif not cells:
            return ExitCode.OK
    order = parse_order(options.order) if options.order is not None else None
    if order is not None:
        cells = arrange(cells, order)
        hooks.say(f"order: {order} (--order {order} runs this order again)")
    if options.failed_first:
        cells, failed = failed_first(cells, _last_failed(recorded.out))
        hooks.say(f"failed first: {failed} cells that failed in the last recorded run")
    return _Narrowed(cells=cells, selection=selection, keys=keys, order=order)


def _last_failed(out: Path) -> set[str]:
    """The cells that did not pass when they last ran in ``out`` (none when no run wrote
    the record, or it is unreadable: an order hint never fails a run)."""
    try:
        return {e.cell_id for e in read_last_failed(out) or ()}
    except ValueError:
        return set()


def _run_assembled(options: RunOptions, run: Assembled, hooks: Hooks
                   ) -> tuple[RunReport, int | None]:
    """Run the assembled cells; report.html, the cache's uploads and the summary after.
    (The report, and the signal that stopped the run.)"""
    prepared, placement = run.prepared, run.plan.placement
    if placement.skipped:
        hooks.warn(f"skipping {len(placement.skipped)} cuda cells wider than the "
                   f"{placement.devices} GPU(s) visible (one rank per GPU); they are reported "
                   "as skipped")
    hooks.say(f"runner: {prepared.runner.name} ({prepared.why_runner})")
    if run.note:
        hooks.say(run.note)
    if options.runs_per_test > 1:
        hooks.say(f"runs per test: {options.runs_per_test} (each of the "
                  f"{len(placement.cells)} cells runs that often; runs that disagree make it "
                  "FLAKY)")
    with stop_on_signals() as stopper:
        try:
            report = run.run(Watch(on_start=hooks.start, on_result=hooks.result,
                                            on_launch=hooks.launched, stopper=stopper,
                                            maxfail=options.maxfail))
        finally:
            hooks.done()
        _finish(prepared.out, prepared, report, hooks)
    return report, stopper.signum


def _finish(out: Path, prepared: PreparedRun, report: RunReport, hooks: Hooks) -> None:
    """report.html; the cache's line and its layers' uploads and record; the summary."""
    from cpmatrix.report.html import write_report_html

    write_report_html(out, warn=hooks.warn)
    update_last_failed(out, report.results.values(), at=time.time())  # repro --failed's
    if prepared.cache_note:
        hooks.say(prepared.cache_note)
    if prepared.cache_layers is not None:
        for line in prepared.cache_layers.finish():
            hooks.say(line)
        prepared.cache_layers.record(out)
    hooks.summary(report, out)
    if prepared.mutants is not None:
        hooks.say(report.mutant_line())


def _exit_code(report: RunReport, signum: int | None, placement: Placement,
               hooks: Hooks) -> int:
    stopped = report.stopped_by or signum
    if stopped is not None:
        hooks.warn(f"stopped by {signal.Signals(stopped).name}: unfinished cells are "
                   "reported as interrupted")
        return exit_code_for(stopped)
    if not placement.cells:
        hooks.warn(_nothing_fits(len(placement.skipped), placement.devices)
                   + "; the report lists them as skipped")
        return ExitCode.NOTHING_SELECTED
    # A skipped cell is not ok either: 0 means every selected cell passed.
    return ExitCode.OK if all(r.status.ok for r in report.results.values()) else ExitCode.FAILURES


def _nothing_fits(skipped: int, gpus: int) -> str:
    return (f"nothing to run: each of the {skipped} selected cells needs more GPUs than the "
            f"{gpus} visible (one rank per GPU; select narrower meshes, e.g. -k 1x1)")


def plan_only(cells: list[Cell], platforms: Mapping[str, Platform], options: RunOptions,
              hooks: Hooks, *, scheduler: Scheduler, recorded: Recorded,
              executors: Sequence[Executor]) -> int:
    """``--dry-run``: print the plan each of ``executors`` makes (the busiest first); run
    nothing. Placed and planned as a real run is (:func:`assemble`), without the cache
    and the mutants: the dry run looks nothing up."""
    placement = place_cells(options, cells, platforms, scheduler=scheduler,
                            recorded=recorded, executors=executors, front=Front())
    plan = make_plan(executors, placement)
    fits, skipped, devices = placement.cells, placement.skipped, placement.devices
    runs = plan.runs  # each run is an entry of the plan, as in a real run
    plans = plan.batches[::-1]
    jobs = ", ".join(f"{len(batches)} {ex.plural}" for ex, batches in plans if batches)
    times = f" x {runs} runs" if runs > 1 else ""
    hooks.say(f"plan: {len(fits)} cells{times} in {jobs or 'no jobs'} "
              f"(runner: {options.runner})")
    for ex, batches in plans:
        for b in batches:
            hooks.say(ex.describe(b))
            for line in ex.describe_cells(b):
                hooks.say(line)
    hooks.say(scheduler.describe(plans))
    if skipped:
        hooks.say(f"skipped (not run on this host, reported as skipped): {len(skipped)} cells")
        for c, why in skipped:
            hooks.say(f"  {c.id}  {why}")
    if placement.needs_devices and devices == 0:
        hooks.say("note: no CUDA device is visible here, so a real run exits 2; "
                  "--gpus N plans for a host with N GPUs")
    if not fits:
        hooks.warn(_nothing_fits(len(skipped), devices))
        return ExitCode.NOTHING_SELECTED
    return ExitCode.OK


def check_options(options: RunOptions) -> None:
    """Refuse (:class:`UsageError`) options no scheduler takes (Slurm's flags without
    Slurm): a front that runs on this host whatever ``--scheduler`` says checks them as
    a run does, before it reads anything."""
    scheduler_for(options)


@dataclass(frozen=True)
class Reproduced:
    """A one-cell run: its report (None when the cell cannot run here), exit code, and
    the result repro shows (the mutant run's, with a mutant; None when it stopped)."""

    report: RunReport | None
    code: int
    result: Result | None = None


class ReproHooks(Protocol):
    """What ``repro`` shows: its lines, the paste line, the logs while the cell runs."""

    def say(self, line: str) -> None: ...
    def warn(self, line: str) -> None: ...
    def ready(self, runner: str) -> None:
        """The runner is chosen: the command that reruns this is known."""
    def watching(self, out: Path) -> AbstractContextManager[object]:
        """While the cell runs (its worlds' logs grow under ``out / "worlds"``)."""


def reproduce(options: RunOptions, matrix: Matrix, cells: Sequence[Cell], *, mutant: str,
              hooks: ReproHooks, executors: Sequence[Executor]) -> Reproduced:
    """Rerun exactly ``cells`` (one cell with ``mutant``: then once with it switched on),
    with the setup of ``cpmatrix run`` (runner, interpreter, devices, ``executors``):
    always run, never cached, in one world here."""
    # One world, here, whatever the options' scheduler: repro reruns its cells; the
    # cells it cannot run are said below, not reported.
    front = Front(scheduled=False, report_skipped=False,
                  mutants={cells[0].id: ["", mutant]} if mutant else None)
    with _assembled(options, matrix, cells, front, executors) as run:
        prepared, placement = run.prepared, run.plan.placement
        for cell, why in placement.skipped:
            hooks.warn(f"{cell.id}: cannot run here: {why}")
        if not placement.cells:
            return Reproduced(report=None, code=ExitCode.USAGE)
        hooks.say(f"runner: {prepared.runner.name} ({prepared.why_runner})")
        hooks.ready(prepared.runner.name)
        with hooks.watching(prepared.out), stop_on_signals() as stopper:
            report = run.run(Watch(stopper=stopper))
    if report.stopped_by is not None:
        return Reproduced(report=report, code=exit_code_for(report.stopped_by))
    result = list(report.results.values())[-1]  # the mutant run, with --mutant
    ok = all(r.status.ok for r in report.results.values())
    return Reproduced(report=report, result=result,
                      code=ExitCode.OK if ok else ExitCode.FAILURES)


def execute_cells(options: RunOptions, matrix: Matrix, cells: Sequence[Cell], *,
                  on_result: Callable[[Entry, Result], None],
                  on_start: Callable[[int], None] | None = None,
                  spare: Spare | None = None, executors: Sequence[Executor]) -> RunReport:
    """The pytest plugin's run of ``cells`` by ``executors``: claim, assemble, run
    (no report.html, no summary: pytest reports). A result being reported is reported
    whole: Ctrl-C meanwhile waits for it, then stops the run. ``spare``: a launcher
    started while the plugin collected, for the first world that fits."""
    with _assembled(options, matrix, cells, Front(weighed=False, spare=spare),
                    executors) as run, \
            stop_on_signals() as stopper:
        return run.run(Watch(on_result=_whole(stopper, on_result),
                                      on_start=on_start, stopper=stopper))


def _whole(stopper: Stopper, on_result: Callable[[Entry, Result], None]
           ) -> Callable[[Entry, Result], None]:
    def whole(entry: Entry, result: Result) -> None:
        # (Once the run is stopping, the stopper is held already.)
        held, signum = stopper.held, stopper.signum
        stopper.held = True
        try:
            on_result(entry, result)
        finally:
            stopper.held = held
        if not held and signum is None and stopper.signum is not None:
            raise StopRequested(stopper.signum)

    return whole
