"""A run: the plan's batches -> jobs (with restarts and retries) -> results -> merged report.

:func:`run_cells` is what ``cpmatrix run`` calls, with the run's
:class:`~cpmatrix.plan.plan.Plan` (made once, before: :func:`cpmatrix.plan.plan.make_plan`),
which it executes as given. It owns the scheduling loop and knows no cell kind: each
batch's executor makes the job that runs it; fault handling lives in the executors, what
a result means in :mod:`cpmatrix.supervise.policies`.

Guarantees: every planned entry ends as exactly one result; a crashed cell is retried
once alone (passed on retry -> FLAKY); with ``runs=N`` every cell is planned N times
(runs 1..N, packed like any cells) and combined by :mod:`cpmatrix.repeated`); a world that
cannot start is retried twice and then its cells fail with the launcher's error; the
report is written atomically, in a ``finally``: after Ctrl-C/SIGTERM (unfinished cells
``interrupted``) and after an internal error of cpmatrix (unfinished cells ``crash``, the
error named, then re-raised).
When the run ends, no process it started is left (see :mod:`cpmatrix.worker.procs`).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from cpmatrix.fsutil import atomic_write_json
from cpmatrix.layout import RunLayout
from cpmatrix.matrix.schema import Cell, Platform
from cpmatrix.plan.batches import DevicePool
from cpmatrix.plan.packing import Packing
from cpmatrix.plan.plan import Plan
from cpmatrix.report.history import CellHistory, save_run_history, with_runs
from cpmatrix.report.junit import write_run_junit
from cpmatrix.report.repro_line import repro_command
from cpmatrix.result import FailureKind, Result, Status, testcase_name
from cpmatrix.supervise.context import RunContext
from cpmatrix.supervise.entry import Entry
from cpmatrix.supervise.executors.base import Executor, Job
from cpmatrix.supervise.policies import CrashRetry, combine_entries, interpret_mutant, next_run
from cpmatrix.supervise.run_report import RunReport
from cpmatrix.supervise.stopping import Stopper, StopRequested
from cpmatrix.worker.procs import (
    descendants,
    kill_all,
    processes_with_token,
    reap_orphans,
    set_child_subreaper,
)

__all__ = ["JobPool", "Known", "Watch", "run_cells"]

#: How often a job that never starts is launched again before its cells fail.
START_RETRIES = 2
#: How often a batch's job may be ended from outside (a Slurm job cancelled, past its
#: time limit, its node lost) before its unfinished cells end ``infra``.
LOST_RETRIES = 2


@dataclass
class _Item:
    """A batch waiting for (or running as) a job."""

    batch: str
    entries: list[Entry]
    executor: Executor
    launches: int = 0
    failed_starts: int = 0
    last_error: str = ""
    #: Jobs of this batch the infrastructure ended from outside.
    lost: int = 0
    #: The plan's packing of exactly ``entries`` (the batch's), handed to its job as
    #: given; None for the cells a job handed back (their new job packs them).
    packing: Packing | None = None


@dataclass(frozen=True, kw_only=True)
class JobPool:
    """Jobs at once, cuda devices in the pool, and the scheduler's job wrapper
    (:class:`cpmatrix.supervise.schedulers.Scheduling`)."""

    jobs: int = 1
    devices: int = 0
    #: Makes each job another scheduler's
    #: (:class:`cpmatrix.supervise.schedulers.slurm.SlurmJob`); the plan orders their
    #: launches for it (``Placement.longest_first``).
    wrap_job: Callable[[Job], Job] | None = None


@dataclass(frozen=True, kw_only=True)
class Known:
    """What is known of the cells before the run: cached passes (the plan's
    :attr:`~cpmatrix.plan.plan.Plan.cached` are reported by them) and how to store new
    ones, recorded histories."""

    cached: Mapping[str, Result] = field(default_factory=dict)
    store: Callable[[Cell, Result], str] | None = None
    #: The run's recorded histories, read once before the run
    #: (:meth:`cpmatrix.supervise.sharding.Recorded.merged`): this run's history starts from them
    #: (none handed: a fresh history). What the worlds pack by is ``RunContext.durations``,
    #: made from the same reading.
    recorded: Mapping[str, CellHistory] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Watch:
    """Who hears of the run: the total when it starts, each result, each job launched
    (its name and what it is); the stopper; ``maxfail`` (``-x``/``--maxfail N``): after
    that many cells did not pass, the rest is not run (reported ``interrupted``, saying
    so: a gate never passes a run that stopped early).
    """
    on_start: Callable[[int], None] | None = None
    on_result: Callable[[Entry, Result], None] | None = None
    on_launch: Callable[[str, str, int], None] | None = None
    stopper: Stopper | None = None
    maxfail: int = 0


class _MaxFail(Exception):
    """``maxfail`` cells did not pass: the run stops (not an error: exit 1 as usual)."""


#: One job at a time, nothing known, nobody watching: a plain run's sections.
_ONE_BY_ONE, _NOTHING_KNOWN, _UNWATCHED = JobPool(), Known(), Watch()


def run_cells(plan: Plan[Executor], platforms: Mapping[str, Platform], context: RunContext,
              *, pool: JobPool = _ONE_BY_ONE, known: Known = _NOTHING_KNOWN,
              watch: Watch = _UNWATCHED) -> RunReport:
    """Run ``plan`` as given: each batch by the executor that planned it; its cached
    cells reported by their cached pass (``known.cached``), its skipped cells ``skipped``;
    write the report.

    ``plan.runs`` (``--runs-per-test``): each cell runs that many times (run numbers
    1..N), the report holds one result per cell, its runs combined (``Result.runs``,
    ``runs_passed``); the history gets every run.

    The report is written whatever happens: a Ctrl-C/SIGTERM (``StopRequested``) ends the
    run early with the unfinished cells ``interrupted`` (``RunReport.stopped_by``); an
    exception of cpmatrix itself fails the unfinished cells naming it, and is re-raised
    once the report is written.
    """
    out = context.out_root
    out.mkdir(parents=True, exist_ok=True)
    # A previous run's worlds and cell folders would be read as this run's progress.
    layout = RunLayout(out)
    for stale in layout.job_folders():
        shutil.rmtree(stale, ignore_errors=True)
    history = dict(known.recorded)
    session = _Session(context, platforms, pool=pool, store=known.store,
                       on_result=watch.on_result)
    session.watch = watch
    _queue(session, plan)
    if watch.on_start is not None:
        watch.on_start(len(session.planned) + len(plan.cached))
    for c in plan.cached:
        entry = Entry(cell=c)
        session.planned.append(entry)
        session.record("cached", entry, known.cached[c.id])
    for c, why in plan.skipped:
        entry = Entry(cell=c)
        session.planned.append(entry)
        session.record("skipped", entry, Result(cell_id=c.id, status=Status.SKIPPED,
                                                message=f"not run: {why}"), notify=False)
    stopped_by, internal = _drive(session, watch.stopper)
    ordered = {e.key: session.results[e.key] for e in session.planned}
    # Every run, before its cell's runs are combined: the history is the runs'.
    runs_history = with_runs(history, ordered.values(), at=time.time())
    if plan.runs > 1:
        ordered, session.by_batch = combine_entries(session.planned, ordered,
                                                     session.by_batch)
    report = layout.report_xml
    write_run_junit(layout,
                    {b: [ordered[k] for k in keys] for b, keys in session.by_batch.items()},
                    {c.id: c for c in (*plan.cells, *(c for c, _ in plan.skipped))},
                    run_id=context.run_id,
                    properties={"cpmatrix.order": context.order} if context.order else None)
    atomic_write_json(layout.results, [r.to_dict() for r in ordered.values()])
    atomic_write_json(layout.timings, {"wall_s": round(time.monotonic() - session.t0, 3),
                                       "jobs": list(session.times.values())})
    save_run_history(out, runs_history)
    if internal is not None:
        raise internal
    return RunReport(
        results=ordered, wall_s=time.monotonic() - session.t0, report_path=report,
        planned=session.jobs_planned, starts=session.jobs_started, stopped_by=stopped_by,
        world_jobs=frozenset(ex.name for ex, _ in plan.batches if ex.starts_worlds),
    )


def _queue(session: _Session, plan: Plan[Executor]) -> None:
    """Queue the plan's batches as given, in its launch order, each with its packing (a
    cell's runs numbered 1..N)."""
    run_numbers: dict[str, int] = {}
    for executor, b in plan.launches:
        entries = [Entry(cell=c, mutant=b.mutant_of(i),
                         run=next_run(run_numbers, c.id) if plan.runs > 1 else 0)
                   for i, c in enumerate(b.cells)]
        session.planned.extend(entries)
        session.queue.append(_Item(batch=b.name, entries=entries, executor=executor,
                                   packing=b.packing))
        session.jobs_planned[executor.name] = session.jobs_planned.get(executor.name, 0) + 1


def _drive(session: _Session, stopper: Stopper | None
           ) -> tuple[int | None, BaseException | None]:
    """Run the queued jobs to the end; (the signal that stopped them, an internal error).
    Whatever ends the loop, no process of the run is left and every entry has a result."""
    stopped_by: int | None = None
    internal: BaseException | None = None
    children_before = set(descendants(os.getpid()))
    subreaper = set_child_subreaper(True)
    try:
        session.run_jobs()
    except _MaxFail:
        pass  # the unfinished cells are closed below, saying why
    except StopRequested as exc:
        stopped_by = exc.signum
    except KeyboardInterrupt:  # a SIGINT outside stop_on_signals (e.g. a direct caller)
        stopped_by = signal.SIGINT
    except Exception as exc:  # a bug of cpmatrix: the report still says what happened
        internal = exc
    finally:
        if stopper is not None:
            stopper.hold()  # from here on a signal only waits for the report
        session.kill_jobs()
        _sweep_run(session.context.run_id, children_before)
        if subreaper:
            set_child_subreaper(False)
    session.close_unfinished(stopped_by, internal)
    return stopped_by, internal


class _Session:
    """The state of one run: the queue of batches, the running jobs, and the results."""

    def __init__(self, context: RunContext, platforms: Mapping[str, Platform], *,
                 pool: JobPool, store: Callable[[Cell, Result], str] | None,
                 on_result: Callable[[Entry, Result], None] | None) -> None:
        self.context = context
        self.wrap_job = pool.wrap_job
        self.platforms = platforms
        self.jobs = max(1, pool.jobs)
        self.devices = pool.devices
        self.pool = DevicePool(pool.devices)
        self.store = store
        self.on_result = on_result
        self.t0 = time.monotonic()
        self.planned: list[Entry] = []
        self.queue: deque[_Item] = deque()
        self.active: list[tuple[_Item, Job]] = []
        self.results: dict[str, Result] = {}
        self.retry = CrashRetry()
        self.by_batch: dict[str, list[str]] = {}
        self.jobs_planned: dict[str, int] = {}
        self.jobs_started: dict[str, int] = {}
        #: Mutant results waiting for their unmutated cell's result, by cell id.
        self.pending: dict[str, list[tuple[str, Entry, Result]]] = {}
        self._planned_keys: set[str] = set()
        self.watch = _UNWATCHED
        #: Cells that did not pass so far, and whether ``maxfail`` stopped the run.
        self.not_passed = 0
        self.stopped_early = False
        #: Job name -> what it is, its cells, when (s into the run) it started, first
        #: returned a result and ended (``timings.json``).
        self.times: dict[str, dict[str, object]] = {}
        self.closing = False

    @property
    def starts(self) -> int:
        return sum(self.jobs_started.values())

    def record(self, batch: str, entry: Entry, result: Result, notify: bool = True) -> None:
        source = self.context.sources.get(entry.cell.id)
        if source is not None:  # what this run computed it from (a cached pass too)
            result = replace(result, source=dict(source))
        if not result.status.ok and result.status is not Status.SKIPPED \
                and self.context.repro is not None:
            result = replace(result, repro=repro_command(entry.cell.id, entry.mutant,
                                                         self.context.repro))
        self.results[entry.key] = result
        self.by_batch.setdefault(batch, []).append(entry.key)
        if notify and self.on_result is not None:
            self.on_result(entry, result)
        if notify and not result.status.ok and result.status is not Status.SKIPPED:
            self.not_passed += 1
            if self.watch.maxfail and self.not_passed >= self.watch.maxfail \
                    and not (self.stopped_early or self.closing):
                self.stopped_early = True
                raise _MaxFail

    def finish(self, item: _Item, entry: Entry, result: Result) -> None:
        """Take a result: mutant scoring, crash retry (FLAKY or FAILED), the cache."""
        key = entry.key
        if key in self.results:
            # Never two results for one cell: the first one stands.
            print(f"cpmatrix: internal: a second result for {key} was dropped "
                  f"({result.status.value})", file=sys.stderr)
            return
        if entry.mutant:
            # judged against the unmutated cell of this run, once its result is final
            base = self.results.get(testcase_name(entry.cell.id))
            if base is None and self._base_planned(entry):
                self.pending.setdefault(entry.cell.id, []).append(
                    (item.batch.removesuffix("-retry"), entry, result))
                return
            final: Result | None = interpret_mutant(result, base)
        else:
            final, again = self.retry.decide(entry, result,
                                             retries=item.executor.retries_crashes)
            if again is not None:
                self.queue.append(_Item(batch=f"{item.batch}-retry", entries=[again],
                                        executor=item.executor))
                return
        assert final is not None
        if self.store is not None and final.status is Status.PASSED and not entry.mutant:
            why = self.store(entry.cell, final)
            if why:  # in the report: a pass that will run again, and why
                final = replace(final, evidence={**final.evidence, "not_cached": why})
        self.record(item.batch.removesuffix("-retry"), entry, final)
        if not entry.mutant:
            self.judge_pending(entry.cell.id)

    def _base_planned(self, entry: Entry) -> bool:
        """Whether the unmutated run of ``entry``'s cell is planned (it is for every cell
        of ``--mutants``: a mutant is only judged against a green cell of the same run)."""
        if len(self._planned_keys) != len(self.planned):
            self._planned_keys = {e.key for e in self.planned}
        return testcase_name(entry.cell.id) in self._planned_keys

    def judge_pending(self, cell_id: str) -> None:
        """Judge the mutant runs of ``cell_id`` that waited for its unmutated result."""
        base = self.results.get(testcase_name(cell_id))
        for batch, entry, result in self.pending.pop(cell_id, []):
            self.record(batch, entry, interpret_mutant(result, base))

    def run_jobs(self) -> None:
        """Launch and poll jobs until the queue is empty (``jobs`` at a time)."""
        while self.queue or self.active:
            while self.queue and len(self.active) < self.jobs:
                if not self._launch_next():
                    break
            time.sleep(0.05)
            still: list[tuple[_Item, Job]] = []
            for item, job in self.active:
                for entry, result in job.poll():
                    self.times.get(job.name, {}).setdefault("first_result_s", self._now())
                    self.finish(item, entry, result)
                if job.finished:
                    self.times.get(job.name, {}).setdefault("ended_s", self._now())
                    self._after_job(item, job)
                else:
                    still.append((item, job))
            self.active = still

    def _launch_next(self) -> bool:
        """Start the next queued job; False when it must wait for devices."""
        item = self.queue[0]
        platform = self.platforms[item.entries[0].cell.platform]
        need = item.executor.devices_needed(item.entries, platform, self.context.pack)
        devs: tuple[int, ...] = ()
        if need:
            taken = self.pool.take(need)
            if taken is None:
                if not self.active:
                    raise RuntimeError(f"a {need}-rank cuda world needs {need} devices; "
                                       f"only {self.devices} visible")
                return False
            devs = taken
        self.queue.popleft()
        item.launches += 1
        name = f"{self.starts:03d}-{item.batch}.a{item.launches}"
        job = item.executor.job(name, item.entries, platform, self.context, devs,
                                packing=item.packing)
        if self.wrap_job is not None:
            job = self.wrap_job(job)
        job.start()
        self.times[name] = {"name": name, "what": item.executor.noun,
                            "cells": len(item.entries), "started_s": self._now()}
        if self.watch.on_launch is not None:
            self.watch.on_launch(name, item.executor.noun, len(item.entries))
        self.jobs_started[item.executor.name] = self.jobs_started.get(item.executor.name, 0) + 1
        self.active.append((item, job))
        return True

    def _after_job(self, item: _Item, job: Job) -> None:
        self.pool.give(job.devices)
        if job.start_failed:
            item.failed_starts += 1
            item.last_error = job.start_error
            if item.failed_starts > START_RETRIES:
                for entry in job.remaining:
                    self.finish(item, replace(entry, attempt=2), Result(
                        cell_id=entry.cell.id, status=Status.CRASH, kind=FailureKind.CRASH,
                        message=f"could not start {item.executor.noun} after "
                        f"{item.failed_starts} tries: "
                        f"{item.last_error}", stderr_tails={-1: job.launcher_tail()},
                        mutant=entry.mutant, out_dir=entry.out_dir))
                return
            self.queue.appendleft(_Item(batch=item.batch, entries=job.remaining,
                                        executor=item.executor, launches=item.launches,
                                        failed_starts=item.failed_starts))
        elif job.lost and job.remaining:
            # Ended from outside: no cell in flight is to blame; all of them run again in
            # a new job, or, when that keeps happening, end with no verdict ("infra").
            lost = item.lost + 1
            if lost > LOST_RETRIES:
                for entry in job.remaining:
                    self.finish(item, entry, Result(
                        cell_id=entry.cell.id, status=Status.INFRA, attempts=entry.attempt,
                        message=f"no verdict: {item.executor.noun} running this cell was "
                        f"ended from outside {lost} times, last: {job.lost}",
                        mutant=entry.mutant, out_dir=entry.out_dir))
                return
            self.queue.appendleft(_Item(batch=item.batch, entries=job.remaining,
                                        executor=item.executor, launches=item.launches,
                                        lost=lost))
        elif job.remaining:
            # A fault (or a recycle) took the job down: the rest runs in a fresh one.
            self.queue.appendleft(_Item(batch=item.batch, entries=job.remaining,
                                        executor=item.executor, launches=item.launches,
                                        lost=item.lost))

    def kill_jobs(self) -> None:
        for _, job in self.active:
            job.kill()
            self.times.get(job.name, {}).setdefault("ended_s", self._now())
        self.active = []

    def _now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def close_unfinished(self, stopped_by: int | None, internal: BaseException | None) -> None:
        """Every planned entry ends as exactly one result, whatever stopped the run; a
        mutant run that finished before its unmutated cell is then NOT JUDGED."""
        self.closing = True
        waiting = {e.key for runs in self.pending.values() for _, e, _ in runs}
        for entry in self.planned:
            if entry.key in self.results or entry.key in waiting:
                continue
            if self.stopped_early:
                n = self.watch.maxfail
                why = "the first failure (-x)" if n == 1 else f"{n} failures (--maxfail {n})"
                result = Result(cell_id=entry.cell.id, status=Status.INTERRUPTED,
                                mutant=entry.mutant, out_dir=entry.out_dir,
                                message=f"not run: the run stopped after {why}")
            elif stopped_by is not None:
                result = Result(
                    cell_id=entry.cell.id, status=Status.INTERRUPTED, mutant=entry.mutant,
                    out_dir=entry.out_dir, message=f"interrupted: the run was stopped "
                    f"({signal.Signals(stopped_by).name}) before this cell finished")
            elif internal is not None:
                result = Result(
                    cell_id=entry.cell.id, status=Status.CRASH, kind=FailureKind.CRASH,
                    mutant=entry.mutant, out_dir=entry.out_dir,
                    message=f"cpmatrix internal error before this cell finished: "
                    f"{type(internal).__name__}: {internal}",
                    stderr_tails={-1: "".join(traceback.format_exception(internal))[-4000:]})
            else:  # should not happen
                result = Result(cell_id=entry.cell.id, status=Status.CRASH,
                                kind=FailureKind.CRASH, mutant=entry.mutant,
                                message="cpmatrix lost track of this cell (bug)")
            self.record("unfinished", entry, result)
        for cell_id in list(self.pending):
            self.judge_pending(cell_id)


def _sweep_run(run_id: str, children_before: set[int]) -> None:
    """Kill what the run left: its jobs' processes (by token) and orphans re-parented to
    us while it ran (we are their subreaper); then reap them."""
    # Again until nothing is left: a killed rank's orphans (a daemon in its own session,
    # with an empty environment) are re-parented to us only once the rank has exited,
    # which SIGKILL does not wait for. Seen with ranks of a large forked parent.
    for _ in range(40):
        leftovers = processes_with_token(f"{run_id}/", prefix=True) if run_id else []
        leftovers += [p for p in descendants(os.getpid()) if p not in children_before]
        if not leftovers:
            break
        kill_all(leftovers)
        time.sleep(0.05)
    reap_orphans(keep=children_before)
