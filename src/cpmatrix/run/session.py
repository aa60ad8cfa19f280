"""A run: plan -> worlds (with restarts and retries) -> results -> merged report.

:func:`run_cells` is what ``cpmatrix run`` calls. It owns the scheduling loop; the
per-world fault handling lives in :mod:`cpmatrix.run.executors.world`.

Guarantees: every planned entry ends as exactly one result; a crashed cell is retried
once alone (passed on retry -> FLAKY); a world that cannot start is retried twice
and then its cells fail with the launcher's error; the report is written atomically,
in a ``finally``: after Ctrl-C/SIGTERM (unfinished cells ``interrupted``) and after an
internal error of cpmatrix (unfinished cells ``crash``, the error named, then re-raised).
When the run ends, no process it started is left (see :mod:`cpmatrix.remote.procs`).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from cpmatrix.fsutil import atomic_write_json, read_json, tail_lines
from cpmatrix.matrix.schema import Cell, Platform
from cpmatrix.remote.procs import (
    descendants,
    kill_all,
    processes_with_token,
    reap_orphans,
    set_child_subreaper,
)
from cpmatrix.report.junit import merge_junit, results_to_junit, testcase_name, write_junit
from cpmatrix.result import FailureKind, Result, Status
from cpmatrix.run.executors.compile import run_spill_cells
from cpmatrix.run.executors.world import Entry, WorldOptions, WorldRun
from cpmatrix.run.plan import DevicePool, plan_batches
from cpmatrix.run.stopping import Stopper, StopRequested

__all__ = ["RunReport", "load_durations", "run_cells"]

#: How often a world that never starts is launched again before its cells fail.
START_RETRIES = 2


@dataclass
class RunReport:
    """What a run produced; ``results`` maps entry key -> result, in plan order."""

    results: dict[str, Result]
    wall_s: float
    world_starts: int
    report_path: Path
    worlds: int = 0
    #: The signal that stopped the run early (SIGINT, SIGTERM), if any.
    stopped_by: int | None = None

    def mutant_line(self) -> str:
        """``mutants: K/N killed (kill rate X%)``, naming the survivors."""
        runs = [r for r in self.results.values() if r.mutant]
        killed = [r for r in runs if r.evidence.get("mutant_outcome") == "killed"]
        survivors = [testcase_name(r.cell_id, r.mutant) for r in runs if r not in killed]
        rate = 100.0 * len(killed) / len(runs) if runs else 100.0
        line = f"mutants: {len(killed)}/{len(runs)} killed (kill rate {rate:.1f}%)"
        if survivors:
            line += "\nsurvived (vacuous for these bugs):\n  " + "\n  ".join(survivors)
        return line

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results.values():
            out[r.status.value] = out.get(r.status.value, 0) + 1
        return out


def load_durations(out_root: Path) -> dict[str, float]:
    try:
        data = read_json(out_root / "durations.json")
        return {str(k): float(v) for k, v in data.items()}
    except (OSError, ValueError, AttributeError):
        return {}


@dataclass
class _Item:
    batch: str
    entries: list[Entry]
    launches: int = 0
    failed_starts: int = 0
    last_error: str = ""


def run_cells(
    cells: Sequence[Cell],
    platforms: Mapping[str, Platform],
    options: WorldOptions,
    *,
    batch_size: int | None = None,
    jobs: int = 1,
    devices: int = 0,
    mutants: Mapping[str, Sequence[str]] | None = None,
    keep_order: bool = False,
    cached: Mapping[str, Result] | None = None,
    store: Callable[[Cell, Result], None] | None = None,
    spill_cache: Path | None = None,
    on_result: Callable[[Entry, Result], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    stopper: Stopper | None = None,
    skipped: Sequence[tuple[Cell, str]] = (),
) -> RunReport:
    """Run ``cells`` (or, with ``mutants``, each cell once per mutant) and write the report.

    ``skipped`` holds cells that are not run here, each with the reason (a cuda cell
    wider than the GPUs visible, see :func:`cpmatrix.run.plan.fit_to_devices`): no world is
    planned for them, and the report holds each as ``skipped`` with that message.

    The report is written whatever happens: a Ctrl-C/SIGTERM (``StopRequested``) ends the
    run early with the unfinished cells ``interrupted`` (``RunReport.stopped_by``); an
    exception of cpmatrix itself fails the unfinished cells naming it, and is re-raised
    once the report is written.
    """
    out = options.out_root
    out.mkdir(parents=True, exist_ok=True)
    # A previous run's worlds and cell folders would be read as this run's progress.
    for stale in ("worlds", "cells", "spill"):
        shutil.rmtree(out / stale, ignore_errors=True)
    session = _Session(options, platforms, jobs=jobs, devices=devices, store=store,
                       on_result=on_result)
    durations = load_durations(out)
    cached = cached or {}
    hits = [c for c in cells if c.id in cached and not mutants]
    # Spill cells compile a kernel; they need no world (and have no mutants).
    spill_cells = [c for c in cells if c.kind == "spill" and c.id not in cached]
    batches = plan_batches([c for c in cells if not (c.id in cached and not mutants)
                            and c.kind != "spill"],
                           durations=durations, batch_size=batch_size, mutants=mutants,
                           keep_order=keep_order)
    for b in batches:
        entries = [Entry(cell=c, mutant=b.mutant_of(i)) for i, c in enumerate(b.cells)]
        session.planned.extend(entries)
        session.queue.append(_Item(batch=b.name, entries=entries))
    session.planned.extend(Entry(cell=c) for c in spill_cells)
    if on_start is not None:
        on_start(len(session.planned) + len(hits))
    for c in hits:
        entry = Entry(cell=c)
        session.planned.append(entry)
        session.record("cached", entry, cached[c.id])
    for c, why in skipped:
        entry = Entry(cell=c)
        session.planned.append(entry)
        session.record("skipped", entry, Result(cell_id=c.id, status=Status.SKIPPED,
                                                message=f"not run: {why}"), notify=False)

    stopped_by: int | None = None
    internal: BaseException | None = None
    children_before = set(descendants(os.getpid()))
    subreaper = set_child_subreaper(True)
    try:
        if spill_cells:
            item = _Item(batch="spill", entries=[])
            for cell, result in run_spill_cells(spill_cells, out_root=out,
                                                search_path=options.pythonpath,
                                                cache_dir=spill_cache, python=options.python):
                session.finish(item, Entry(cell=cell), result)
        session.run_worlds()
    except StopRequested as exc:
        stopped_by = exc.signum
    except KeyboardInterrupt:  # a SIGINT outside stop_on_signals (e.g. a direct caller)
        stopped_by = signal.SIGINT
    except Exception as exc:  # a bug of cpmatrix: the report still says what happened
        internal = exc
    finally:
        if stopper is not None:
            stopper.hold()  # from here on a signal only waits for the report
        session.kill_worlds()
        _sweep_run(options.run_id, children_before)
        if subreaper:
            set_child_subreaper(False)
    session.close_unfinished(stopped_by, internal)

    ordered = {e.key: session.results[e.key] for e in session.planned}
    cell_index = {c.id: c for c in (*cells, *(c for c, _ in skipped))}
    world_files = []
    for batch, keys in session.by_batch.items():
        path = out / "worlds" / f"{batch}.junit.xml"
        write_junit(path, results_to_junit([ordered[k] for k in keys], cell_index, batch))
        world_files.append(path)
    report = out / "report.xml"
    merge_junit(world_files, report, run_id=options.run_id)
    atomic_write_json(out / "results.json", [r.to_dict() for r in ordered.values()])
    new_durations = dict(durations)
    for r in ordered.values():
        if r.status is Status.PASSED and not r.mutant:
            new_durations[r.cell_id] = round(r.duration_s, 4)
    atomic_write_json(out / "durations.json", new_durations)
    if internal is not None:
        raise internal
    return RunReport(
        results=ordered, wall_s=time.monotonic() - session.t0,
        world_starts=session.world_starts, report_path=report, worlds=len(batches),
        stopped_by=stopped_by,
    )


class _Session:
    """The state of one run: the queue of worlds, those running, and the results."""

    def __init__(self, options: WorldOptions, platforms: Mapping[str, Platform], *,
                 jobs: int, devices: int, store: Callable[[Cell, Result], None] | None,
                 on_result: Callable[[Entry, Result], None] | None) -> None:
        self.options = options
        self.platforms = platforms
        self.jobs = max(1, jobs)
        self.devices = devices
        self.pool = DevicePool(devices)
        self.store = store
        self.on_result = on_result
        self.t0 = time.monotonic()
        self.planned: list[Entry] = []
        self.queue: deque[_Item] = deque()
        self.active: list[tuple[_Item, WorldRun]] = []
        self.results: dict[str, Result] = {}
        self.first_crash: dict[str, Result] = {}
        self.by_batch: dict[str, list[str]] = {}
        self.world_starts = 0

    def record(self, batch: str, entry: Entry, result: Result, *, notify: bool = True) -> None:
        self.results[entry.key] = result
        self.by_batch.setdefault(batch, []).append(entry.key)
        if notify and self.on_result is not None:
            self.on_result(entry, result)

    def finish(self, item: _Item, entry: Entry, result: Result) -> None:
        """Take a result: mutant scoring, crash retry (FLAKY or FAILED), the cache."""
        key = entry.key
        if key in self.results:
            # Never two results for one cell: the first one stands.
            print(f"cpmatrix: internal: a second result for {key} was dropped "
                  f"({result.status.value})", file=sys.stderr)
            return
        if entry.mutant:
            result = interpret_mutant(result)
        elif entry.attempt > 1 and key in self.first_crash:
            first = self.first_crash.pop(key)
            if result.status is Status.PASSED:
                result = replace(
                    first, status=Status.FLAKY, attempts=entry.attempt,
                    evidence=result.evidence, duration_s=result.duration_s,
                    case_s=result.case_s,
                    message=f"passed when retried alone; first attempt: {first.headline()}",
                )
            else:
                result = replace(first, attempts=entry.attempt,
                                 message=f"{first.message}; failed again when retried alone "
                                 f"({result.headline()})".lstrip("; "))
        elif (entry.attempt == 1 and result.kind is FailureKind.CRASH
              and entry.cell.kind != "spill"
              and not result.message.startswith("could not start")):
            # Crashed: retry alone once, to tell FLAKY from FAILED.
            self.first_crash[key] = result
            self.queue.append(_Item(batch=f"{item.batch}-retry",
                                    entries=[replace(entry, attempt=2)]))
            return
        if self.store is not None and result.status is Status.PASSED and not entry.mutant:
            self.store(entry.cell, result)
        self.record(item.batch.removesuffix("-retry"), entry, result)

    def run_worlds(self) -> None:
        """Launch and poll worlds until the queue is empty (``jobs`` at a time)."""
        while self.queue or self.active:
            while self.queue and len(self.active) < self.jobs:
                if not self._launch_next():
                    break
            time.sleep(0.05)
            still: list[tuple[_Item, WorldRun]] = []
            for item, world in self.active:
                for entry, result in world.poll():
                    self.finish(item, entry, result)
                if world.finished:
                    self._after_world(item, world)
                else:
                    still.append((item, world))
            self.active = still

    def _launch_next(self) -> bool:
        """Start the next queued world; False when it must wait for devices."""
        item = self.queue[0]
        platform = self.platforms[item.entries[0].cell.platform]
        need = item.entries[0].cell.world_size if platform.device == "cuda" else 0
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
        name = f"{self.world_starts:03d}-{item.batch}.a{item.launches}"
        world = WorldRun(name, item.entries, platform, self.options, devs)
        world.start()
        self.world_starts += 1
        self.active.append((item, world))
        return True

    def _after_world(self, item: _Item, world: WorldRun) -> None:
        self.pool.give(world.devices)
        if world.start_failed:
            item.failed_starts += 1
            item.last_error = world.start_error
            if item.failed_starts > START_RETRIES:
                _fail_unstarted(item, world, self.finish)
                return
            self.queue.appendleft(_Item(batch=item.batch, entries=world.remaining,
                                        launches=item.launches,
                                        failed_starts=item.failed_starts))
        elif world.remaining:
            # A fault (or a recycle) took the world down: the rest runs in a fresh one.
            self.queue.appendleft(_Item(batch=item.batch, entries=world.remaining,
                                        launches=item.launches))

    def kill_worlds(self) -> None:
        for _, world in self.active:
            world.kill()
        self.active = []

    def close_unfinished(self, stopped_by: int | None, internal: BaseException | None) -> None:
        """Every planned entry ends as exactly one result, whatever stopped the run."""
        for entry in self.planned:
            if entry.key in self.results:
                continue
            if stopped_by is not None:
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


def _sweep_run(run_id: str, children_before: set[int]) -> None:
    """Kill what the run left: its worlds' processes (by token) and orphans re-parented to
    us while it ran (we are their subreaper); then reap them."""
    leftovers = processes_with_token(f"{run_id}/", prefix=True) if run_id else []
    leftovers += [p for p in descendants(os.getpid()) if p not in children_before]
    if leftovers:
        kill_all(leftovers)
    reap_orphans(keep=children_before)


def interpret_mutant(result: Result) -> Result:
    """A mutant run passes when the planted bug made the cell fail (it was killed)."""
    if result.status is Status.PASSED:
        return replace(
            result, status=Status.FAILED, kind=FailureKind.ERROR,
            evidence={**result.evidence, "mutant_outcome": "survived"},
            message=f"mutant {result.mutant!r} survived: the cell passed with this bug "
            "planted, so the test is vacuous for it",
        )
    if result.message.startswith("could not start"):
        return result  # infrastructure, not a kill
    first = result.first_failure
    by = (first.check if first and first.check else "") or (
        first.message.split(":")[0] if first and first.message else "") or (
        result.kind.value if result.kind else "failure")
    return replace(
        result, status=Status.PASSED, kind=None,
        evidence={**result.evidence, "mutant_outcome": "killed", "killed_by": by},
        message=f"mutant {result.mutant!r} killed by {by}: {result.headline()}",
    )


def _fail_unstarted(
    item: _Item, world: WorldRun, finish: Callable[[_Item, Entry, Result], None]
) -> None:
    tail = tail_lines(world.dir / "torchrun.log")
    for entry in world.remaining:
        finish(item, replace(entry, attempt=2), Result(
            cell_id=entry.cell.id, status=Status.CRASH, kind=FailureKind.CRASH,
            message=f"could not start a world after {item.failed_starts} tries: "
            f"{item.last_error}", stderr_tails={-1: tail}, mutant=entry.mutant,
            out_dir=entry.out_dir,
        ))
