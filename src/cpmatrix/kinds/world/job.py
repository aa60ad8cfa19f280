"""A world job: one launch of ranks running parity and property cells, watched.

A :class:`WorldRun` is one launch (fork launcher or torchrun) of some cells, packed onto
its ranks (:mod:`cpmatrix.plan.packing`: cells on disjoint ranks run at once, each in a
process group of its own ranks). It is polled; it never blocks. It reads the ranks'
typed start markers and outcomes (:mod:`cpmatrix.worker.protocol`, ranks counted in the
cell), watches the rank pids (world ranks), and decides, per cell in flight:

- all ranks wrote an outcome for a cell -> that cell's result (passed/failed);
- some rank failed a cell and the others did not finish it within ``abort_grace_s``
  (they wait in a collective the failing rank skipped) -> the world is torn down,
  the cell fails with kind ``error`` naming the failing rank(s);
- a cell ran past its timeout -> every rank's Python stacks are dumped (SIGUSR1 +
  faulthandler) into the cell's folder, the world is killed, kind ``timeout``;
- a rank died -> kind ``crash`` for the cell it was running (its last started one),
  naming that rank and its exit status; a rank that died between cells fails none;
- the world never started (port clash, torch missing, disk full) -> ``start_failed``.

Every other unfinished cell, the ones running beside the faulty one on other ranks
included, is handed back to be run in a fresh world, so no cell is reported failed
because of another cell's fault. Every file read carries the run's id;
when a world ends, every process carrying its token is killed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from cpmatrix.fsutil import atomic_write_json, atomic_write_text, read_segment, tail_lines
from cpmatrix.layout import RunLayout, cell_output_log, cell_stacks, work_folder
from cpmatrix.matrix.schema import Platform
from cpmatrix.plan.batches import expected_s
from cpmatrix.plan.packing import Packing
from cpmatrix.result import FailureKind, RankFailure, Result, Status
from cpmatrix.supervise.context import RunContext
from cpmatrix.supervise.entry import Entry
from cpmatrix.supervise.executors.attribution import (
    COLLATERAL,
    WHOLE,
    describe_status,
    launcher_root_cause,
    result_from_outcomes,
)
from cpmatrix.supervise.executors.launch import (
    Child,
    Progress,
    free_port,
    launcher_argv,
    physical_devices,
    pid_state,
)
from cpmatrix.supervise.executors.spare import world_env
from cpmatrix.supervise.runners.base import Launch
from cpmatrix.worker.protocol import (
    CellSpec,
    Outcome,
    PidFile,
    RankLeft,
    WorldFolder,
    WorldSpec,
    read_typed,
    write_typed,
)

__all__ = ["WorldRun", "cell_spec"]


def cell_spec(entry: Entry) -> CellSpec:
    """The typed cell a rank runs: the axes parsed once, here. (A run's number is 0 in
    ``Entry`` for the only run, so its key and folder are a plain run's; the rank counts
    from 1, and ``seed_for`` draws the same for both.)"""
    return CellSpec.from_cell(entry.cell, out_dir=entry.out_dir, mutant=entry.mutant,
                              run_number=max(entry.run, 1))


class WorldRun:
    """One launch of a world (its ranks started by the run's launcher, fork or torchrun)
    over ``entries``; poll it until ``finished``."""

    #: ``WorldSpec.prepare``: what every rank sets up before its first cell (a subclass's).
    prepare = ""

    def __init__(self, name: str, entries: Sequence[Entry], platform: Platform,
                 context: RunContext, devices: tuple[int, ...] = (), *,
                 packing: Packing | None = None) -> None:
        assert entries, "a world needs at least one cell"
        self.name = name
        self.platform = platform
        self.context = context
        self.devices = devices
        ordered = list(entries)
        if packing is None:  # no plan for exactly these cells: the ones handed back
            packing = _repack(ordered, platform, context)
        assert len(packing.slots) == len(ordered), "a packing is of exactly its entries"
        #: In the order every rank runs its own cells (by planned start).
        self.entries = [ordered[i] for i in packing.order]
        #: Per entry, the world ranks it runs on; its rank r is world rank placement[i][r].
        self.placement = [packing.slots[i].ranks for i in packing.order]
        #: Ranks launched; each cell runs in a process group of its own ranks only
        #: (:mod:`cpmatrix.worker.subworld`), cells on disjoint ranks at once.
        self.world_size = packing.ranks
        #: Every file the supervisor and the ranks exchange (:mod:`cpmatrix.worker.protocol`).
        self.folder = WorldFolder(RunLayout(context.out_root).world(name))
        self.progress = Progress(self.folder.progress, context.run_id)
        self.child = Child(f"{context.run_id or os.getpid()}/{name}", context.runner)
        self.started_at = 0.0
        self.finished = False
        self.remaining: list[Entry] = []
        #: Results for entries, in the order they completed.
        self.results: list[tuple[Entry, Result]] = []
        self.start_failed = False
        self.start_error = ""
        self.lost = ""
        self._reported: set[int] = set()
        self._pids: dict[int, int] = {}
        self._dead: dict[int, tuple[float, str]] = {}
        #: Ranks that ran out of cells and exited normally (their exit is no fault).
        self._left: set[int] = set()
        self._first_error_at: dict[int, float] = {}
        self._done_at: float | None = None

    @property
    def token(self) -> str:
        return self.child.token

    def start(self) -> None:
        """Write the world file and start the launcher; OS errors fail the world's cells."""
        ctx, folder = self.context, self.folder
        try:
            if folder.path.exists():  # never read another launch's progress files
                shutil.rmtree(folder.path)
            self.progress.folder.mkdir(parents=True, exist_ok=True)
            home, tmp = folder.home, folder.tmp
            home.mkdir(exist_ok=True)
            tmp.mkdir(exist_ok=True)
            world = WorldSpec(
                name=self.name, run_id=ctx.run_id, supervisor_pid=os.getpid(),
                dir=str(folder.path), out_root=str(ctx.out_root), backend=self.platform.backend,
                device=self.platform.device, platform=self.platform.name,
                pg_timeout_s=float(max(e.cell.timeout_s for e in self.entries) + 60),
                pythonpath=list(ctx.pythonpath), project_roots=list(ctx.project_roots),
                cells=[cell_spec(e) for e in self.entries], prepare=self.prepare,
                placement=[list(p) for p in self.placement], profile=ctx.profile)
            write_typed(folder.world_file, world)
            env = world_env(ctx.source_env, self.platform.env, ctx.pythonpath,
                            home=str(home), tmp=str(tmp), token=self.token,
                            cuda_visible=physical_devices(self.devices, ctx.source_env)
                            if self.devices else None)
            argv = launcher_argv(ctx.launcher, ctx.python, self.world_size, free_port(),
                                 str(folder.world_file), str(folder.root_cause),
                                 run_id=ctx.run_id)
            launch = Launch(
                argv=argv, env=env, cwd=str(folder.path), writable=(str(ctx.out_root),),
                readonly=tuple(dict.fromkeys((*ctx.readonly, *ctx.pythonpath))),
                name=f"cpmatrix-{os.getpid()}-{self.name}".replace(".", "-"),
                devices=self.devices,
            )
            cmd = self.child.start(launch, folder.launcher_log, ctx.spare)
            atomic_write_json(folder.command_file, {"argv": cmd, "env": launch.env,
                                                    "spare": self.child.adopted})
        except OSError as exc:
            # No cell started: the session retries the launch, then fails its cells
            # with this message (a result reported here would never be polled).
            self.start_failed = True
            self.start_error = f"could not start the world: {type(exc).__name__}: {exc}"
            self.remaining = list(self.entries)
            self.finished = True
            return
        self.started_at = time.monotonic()

    def _report(self, i: int, result: Result) -> None:
        self._reported.add(i)
        self._save_output(i)
        self.results.append((self.entries[i], self._with_folder(self.entries[i], result)))

    def _save_output(self, i: int) -> None:
        """Each rank's share of its log while cell ``i`` ran, into the cell's folder
        (``cell_output_log``; a cached pass brings it back). Evidence: never fails it."""
        for r, log, start, end, began in self._segments(i):
            if began:  # a rank that never began the cell printed nothing of it
                with contextlib.suppress(OSError):
                    atomic_write_text(self.context.out_root / cell_output_log(
                        self.entries[i].out_dir, r), read_segment(log, start, end))

    def _read_progress(self) -> None:
        for outcome in self.progress.read():
            if not outcome.ok:
                self._first_error_at.setdefault(outcome.index, time.monotonic())
        for r in range(self.world_size):
            if r not in self._pids:
                pid = read_typed(self.folder.pid_file(r), PidFile, run=self.context.run_id)
                if pid is not None:
                    self._pids[r] = pid.pid
            if r not in self._left and read_typed(self.folder.left_file(r), RankLeft,
                                                  run=self.context.run_id) is not None:
                self._left.add(r)
                self._dead.pop(r, None)

    def poll(self) -> list[tuple[Entry, Result]]:
        """Advance; return results completed since the last call."""
        if self.finished:
            return []
        before = len(self.results)
        self._read_progress()
        self._collect_complete()
        rc = self.child.returncode()
        now = time.monotonic()
        for r, pid in self._host_pids().items():
            if r not in self._dead and r not in self._left:
                alive, status = pid_state(pid)
                if not alive:
                    self._dead[r] = (now, describe_status(status) if status is not None else "")
        if len(self._reported) == len(self.entries):
            if rc is None:
                # All cells are in; the ranks are tearing down. Give them a moment.
                if self._done_at is None:
                    self._done_at = now
                if now - self._done_at > self.context.timings.teardown_grace_s:
                    self.child.kill(list(self._host_pids().values()))
                    self.finished = True
            else:
                self.child.sweep()  # a case's children must not outlive their world
                self.finished = True
            return self.results[before:]
        if rc is not None:
            self._on_world_exit()
        elif self._dead and now - min(t for t, _ in self._dead.values()) > \
                self.context.timings.dead_rank_grace_s:
            # A rank died and the launcher has not torn the rest down yet: do it ourselves.
            self.child.kill(list(self._host_pids().values()))
            self._on_world_exit()
        else:
            self._check_timeouts(now)
        return self.results[before:]

    def _ranks(self, i: int) -> range:
        """Cell ``i``'s own ranks (0..k-1; world rank ``placement[i][r]``)."""
        return range(self.entries[i].cell.world_size)

    def _last_cell(self, world_rank: int) -> int | None:
        """The last cell ``world_rank`` started (running, or done and in its barrier)."""
        started = [i for i, ranks in enumerate(self.placement) if world_rank in ranks
                   and (i, ranks.index(world_rank)) in self.progress.starts]
        return max(started, default=None)

    def _outcomes(self, i: int) -> dict[int, Outcome | None]:
        return {r: self.progress.dones.get((i, r)) for r in self._ranks(i)}

    def _collect_complete(self) -> None:
        for i, entry in enumerate(self.entries):
            if i in self._reported:
                continue
            outs = [o for o in self._outcomes(i).values() if o is not None]
            # Every rank's outcome in, and final: a rank still checking the groups the
            # cell used may yet find the cell left one unusable (worker/hygiene.py).
            if len(outs) == len(self._ranks(i)) and all(o.final for o in outs):
                self._report(i, result_from_outcomes(entry, outs, tails=self._tails(i)))

    def _with_folder(self, entry: Entry, result: Result) -> Result:
        """A passed or skipped cell's working folder (``cwd``, ``home``, ``tmp`` of its ranks;
        worker/cellenv.py) is removed; a failed cell's is kept, and its result names it.

        Here, not in the ranks: the supervisor's process is off the cells' path (an
        ``rmtree`` in a rank cost 1-10 ms per cell on a loaded 2-core machine)."""
        rel = work_folder(entry.out_dir, self.name)
        if result.status in (Status.PASSED, Status.SKIPPED):  # nothing there to look into
            _remove_folder(self.context.out_root / rel)
            return result
        if not (self.context.out_root / rel).is_dir():
            return result
        note = f"working folder kept: {rel}"
        return replace(result, message=f"{result.message}; {note}" if result.message else note)

    def _tails(self, i: int) -> dict[int, str]:
        return {r: tail_lines(log, start, end) for r, log, start, end, _ in self._segments(i)}

    def _segments(self, i: int) -> Iterator[tuple[int, Path, int, int | None, bool]]:
        """Per rank of cell ``i``: its world log, the cell's bytes there (start marker to
        done marker, or to the end), and whether it began the cell."""
        for r in self._ranks(i):
            start = self.progress.starts.get((i, r))
            done = self.progress.dones.get((i, r))
            yield (r, self.folder.rank_log(self.placement[i][r]),
                   start.log_offset if start else 0, done.log_end if done else None,
                   start is not None)

    def _in_flight(self) -> list[int]:
        """The cells some rank started and not every rank finished (several at once when
        they run on disjoint ranks), in the world's order."""
        return sorted({i for (i, _r) in self.progress.starts} - self._reported)

    def _check_timeouts(self, now: float) -> None:
        flying = self._in_flight()
        ctx = self.context
        if not flying:
            if not self.progress.starts and now - self.started_at > ctx.timings.startup_timeout_s:
                self.child.kill(list(self._host_pids().values()))
                self._on_world_exit(reason="the world did not start within "
                                    f"{ctx.timings.startup_timeout_s:.0f} s")
            return
        for i in flying:
            if self._check_cell(i, now):
                return

    def _check_cell(self, i: int, now: float) -> bool:
        """Cell ``i``'s timeout and failure grace; True when the world was torn down."""
        ctx = self.context
        entry = self.entries[i]
        first_start = min(s.time for (j, _r), s in self.progress.starts.items() if j == i)
        if time.time() - first_start > entry.cell.timeout_s:
            self._abort(i, FailureKind.TIMEOUT,
                        f"cell ran past its timeout of {entry.cell.timeout_s} s")
            return True
        err_at = self._first_error_at.get(i)
        if err_at is not None and now - err_at > ctx.timings.abort_grace_s:
            errors = [o for o in self._outcomes(i).values() if o is not None and not o.ok]
            if all(COLLATERAL.search(o.message) for o in errors) and (
                    self._dead or not ctx.runner.shares_pid_namespace):
                # The only failures say "a peer went away" and a rank died (or, where
                # rank pids cannot be watched, may have): a crash, whichever of the launcher
                # or this grace period notices first. With every rank alive, such a
                # message is the rank's own error (the abort below attributes it).
                self._dump_stacks()
                self.child.kill(list(self._host_pids().values()))
                self._on_world_exit()
            else:
                self._abort(i, FailureKind.ERROR, "")
            return True
        return False

    def _host_pids(self) -> dict[int, int]:
        """Rank pids, only when they are pids in *our* namespace.

        In a container or a pid-unshared sandbox the workers' pids mean other processes
        here: never signal them (we would kill strangers).
        """
        return self._pids if self.context.runner.shares_pid_namespace else {}

    def _dump_stacks(self) -> None:
        self.folder.dump_request.write_text(f"{time.time()}\n")
        for pid in self._host_pids().values():
            try:
                os.kill(pid, signal.SIGUSR1)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(self.context.timings.dump_wait_s)

    def _abort(self, i: int, kind: FailureKind, why: str) -> None:
        """Tear the world down because of cell ``i``; hand back every other unfinished
        cell (those running beside it on other ranks too: they rerun, never fail)."""
        entry = self.entries[i]
        self._dump_stacks()
        self.child.kill(list(self._host_pids().values()))
        self._read_progress()
        self._collect_complete()
        if i in self._reported:
            # Every rank finished the cell while we were dumping stacks: its result is
            # already in. The world is gone all the same; the rest runs in a fresh one.
            self._hand_back()
            return
        outs = self._outcomes(i)
        # Ranks still in the case; else ranks that left it but never finished checking
        # the groups it used (a probe that hangs: a group the cell left in error).
        missing = [r for r, o in outs.items() if o is None] or \
            [r for r, o in outs.items() if o is not None and not o.final]
        if kind is FailureKind.ERROR:
            result = result_from_outcomes(
                entry, [o for o in outs.values() if o is not None], tails=self._tails(i),
                extra_msg=f"rank(s) {', '.join(map(str, missing))} did not finish the cell "
                f"within {self.context.timings.abort_grace_s:.0f} s of the failure (waiting on the "
                "failed rank); their stacks are in the cell folder")
        else:
            root = self.context.out_root
            failures = tuple(
                RankFailure(rank=r, message=f"rank {r} still in the cell after "
                            f"{entry.cell.timeout_s} s",
                            traceback=read_segment(root / cell_stacks(entry.out_dir, r),
                                                   cap=WHOLE))
                for r in missing)
            result = Result(
                cell_id=entry.cell.id, status=Status.TIMEOUT, kind=FailureKind.TIMEOUT,
                failing_ranks=tuple(missing), failures=failures, stderr_tails=self._tails(i),
                duration_s=float(entry.cell.timeout_s), attempts=entry.attempt,
                message=why, mutant=entry.mutant, out_dir=entry.out_dir)
        self._report(i, result)
        self._hand_back()

    def _hand_back(self) -> None:
        self.remaining = [e for j, e in enumerate(self.entries) if j not in self._reported]
        self._reported.update(range(len(self.entries)))
        self.finished = True
        for entry in self.remaining:  # not failed: its folder of this launch goes
            _remove_folder(self.context.out_root / work_folder(entry.out_dir, self.name))

    def _on_world_exit(self, reason: str = "") -> None:
        """The launcher is gone with cells unfinished: a crash, or a world that never started."""
        self.child.sweep()
        self._read_progress()
        self._collect_complete()
        if len(self._reported) == len(self.entries):
            self.finished = True
            return
        flying = self._in_flight()
        if not flying:
            # No cell was in flight: the world failed to start, or every rank left between
            # cells (a recycle): the rest runs in a fresh world.
            if not self.progress.starts:
                self.start_failed = True
                self.start_error = reason or (
                    f"the world's {self.context.launcher} launcher exited before any cell started")
            self._hand_back()
            return
        # The first rank that died (the launcher's root cause, else by pid; world ranks)
        # names the culprit: the cell it was running. Cells on other ranks rerun.
        root = launcher_root_cause(self.context.launcher, self.folder, self.context.run_id)
        first: dict[int, str] = {}
        if root is not None:
            first = {root[0]: root[1]}
        elif self._dead:
            t0 = min(t for t, _ in self._dead.values())
            first = {r: how for r, (t, how) in self._dead.items() if t - t0 < 0.05}
        culprits = sorted({c for r in first if (c := self._last_cell(r)) in flying})
        if first and not culprits:
            # A rank whose last cell was complete died first (waiting for its next one):
            # not a cell's fault. Every unfinished cell runs in a fresh world (attempt
            # unchanged: nothing failed).
            self._hand_back()
            return
        # Nobody seen dying (no root cause, pids not watchable): the earliest cell in
        # flight is the likeliest (it ran longest); a crash is rerun alone, so a wrong
        # guess ends FLAKY, never a false FAIL.
        i = culprits[0] if culprits else flying[0]
        entry = self.entries[i]
        outs = self._outcomes(i)
        ranks = self.placement[i]
        how = {ranks.index(r): v for r, v in first.items() if r in ranks}
        # Without a rank seen dying, the ranks that never wrote an outcome are blamed.
        silent = [r for r, o in outs.items() if o is None]
        dead = sorted(how) or silent
        done = [o for o in outs.values() if o is not None]
        if any(not o.ok and not COLLATERAL.search(o.message) for o in done):
            # A rank raised and the world then broke: the exception is the cause.
            result = result_from_outcomes(entry, done, tails=self._tails(i),
                                          extra_msg="the world died after the failure",
                                          peer_died=bool(dead))
        else:
            failures = tuple(
                RankFailure(rank=r, message=f"rank {r} died during the cell"
                            + (f" ({how[r]})" if how.get(r) else "")) for r in dead
            ) + tuple(RankFailure(rank=o.rank, message=o.message, traceback=o.traceback)
                      for o in done if not o.ok)
            result = Result(
                cell_id=entry.cell.id, status=Status.CRASH, kind=FailureKind.CRASH,
                failing_ranks=tuple(dead), failures=failures, stderr_tails=self._tails(i),
                attempts=entry.attempt, mutant=entry.mutant, out_dir=entry.out_dir,
                message=reason or "a rank died; the world was torn down")
        self._report(i, result)
        self._hand_back()

    def queued(self) -> None:
        self.started_at = time.monotonic()

    def kill(self) -> None:
        """Stop the world now (the run was interrupted)."""
        self.child.kill(list(self._host_pids().values()))
        self.finished = True

    def launcher_tail(self) -> str:
        return tail_lines(self.folder.launcher_log)


def _repack(entries: list[Entry], platform: Platform, context: RunContext) -> Packing:
    """The packing of cells no plan placed together (handed back after a fault): the
    planner's priority, widest then longest first (serial or ``--order``: as given);
    ``entries`` sorted in place to the order the packing's indices refer to."""
    times = {e.key: expected_s(e.cell, context.durations) for e in entries}
    if not context.pack.serial and not context.pack.ordered:
        entries.sort(key=lambda e: (-e.cell.world_size, -times[e.key]))
    return context.pack.plan(platform.name, [e.cell.world_size for e in entries],
                             [times[e.key] for e in entries])


def _remove_folder(folder: Path) -> None:
    """A cell's working folder of one launch, and ``work/`` when nothing else is in it."""
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        folder.parent.rmdir()
