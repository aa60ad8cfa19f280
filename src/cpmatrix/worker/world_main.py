"""The code each rank of a world runs: many cells, several at once on disjoint ranks.

Usage (the supervisor builds this command)::

    python -m torch.distributed.run --nproc-per-node=4 ... -m cpmatrix.worker.world_main W.json

Imports only the standard library, torch and the worker-side part of cpmatrix
(:mod:`~cpmatrix.cell`, :mod:`~cpmatrix.fsutil`, :mod:`cpmatrix.worker`), so start-up stays
cheap and a crash here is easy to read.

The files it reads and writes are the typed ones of :mod:`cpmatrix.worker.protocol`, in
the places its :class:`~cpmatrix.worker.protocol.WorldFolder` names: the
:class:`~cpmatrix.worker.protocol.WorldSpec` job file; per rank a
:class:`~cpmatrix.worker.protocol.PidFile` and its log (stdout+stderr); per cell and rank
(the rank *in the cell*) a :class:`~cpmatrix.worker.protocol.StartMarker` *before* the
cell runs and an :class:`~cpmatrix.worker.protocol.Outcome` *before* any cross-rank step
after it. What the ranks say to each other goes through the launcher's store, in the
protocol's words too (:mod:`cpmatrix.worker.protocol.store`).

Each rank runs the cells placed on it (``WorldSpec.placement``, planned by
:mod:`cpmatrix.plan.packing`) in the world file's order, each in a process group of the
cell's own ranks (:mod:`cpmatrix.worker.subworld`) and, from its first instruction, in the
environment of a world of its own size: rank variables, working folder, ``HOME``,
``TMPDIR`` (:mod:`cpmatrix.worker.cellenv`). After each cell the process state is
restored or the change detected (:mod:`cpmatrix.worker.isolation`, the inventory of
:mod:`cpmatrix.worker.inventory`); when a case changed what cannot be restored, that
process runs no more cells: it tells the peers of each of its remaining cells to skip
it, then exits 0, and the supervisor runs the skipped cells in a fresh world.

Every group the cell used is proven drained and usable before a later cell reuses it, or
it is destroyed and made afresh (:mod:`cpmatrix.worker.hygiene`): a half-finished
operation of one cell is never matched by the next cell's. The outcome is written before
that check, marked not final, and written again, final, once the check is done.

Only the rank process writes outcomes: a child a case forked that comes back out of the
case ends there (:mod:`cpmatrix.worker.forks`).
"""

from __future__ import annotations

import dataclasses
import datetime
import faulthandler
import importlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from cpmatrix.layout import cell_stacks
from cpmatrix.module_names import WORLD_MAIN
from cpmatrix.worker import sever
from cpmatrix.worker.case import run_cell
from cpmatrix.worker.cellenv import CellEnvironment
from cpmatrix.worker.exchange import blame_state, exchange
from cpmatrix.worker.follow import UNOBSERVED
from cpmatrix.worker.hygiene import GroupLedger, Verdict, install_p2p_counter, judge
from cpmatrix.worker.meshes import (
    clear_dtensor_caches,
    destroy_groups,
    destroy_mesh,
    mesh_group_names,
)
from cpmatrix.worker.observe import ReadObserver, warm
from cpmatrix.worker.procs import (
    descendants,
    kill_all,
    set_child_subreaper,
    set_parent_death_signal,
)
from cpmatrix.worker.protocol import (
    DONE,
    RECYCLE,
    START,
    CellSpec,
    PeerReport,
    PidFile,
    RankLeft,
    StartMarker,
    WorldFolder,
    WorldSpec,
    read_typed,
    write_typed,
)
from cpmatrix.worker.stacks import StackDumper
from cpmatrix.worker.subworld import SubWorld

# The fork launcher imports this module before it forks: reading the RECORDs and looking
# at every loaded module once here does it once for every rank (the cache's observer).
warm()


def _redirect_output(log_path: Path) -> TextIO:
    """Send this process's fd 1 and 2 (C-level output too) to its own log file."""
    log = open(log_path, "a", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    return log


def _log_offset() -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    return os.lseek(2, 0, os.SEEK_END)


def _fix_sys_path(pythonpath: list[str]) -> None:
    """The matrix's pythonpath first, in order; the implicit working directory never.

    ``python -m`` puts the current directory first on ``sys.path`` (PYTHONSAFEPATH,
    set by the supervisor, stops that too); a ``cases.py`` there would shadow the case
    module the cell's digest covers.
    """
    cwd = os.getcwd()
    keep = [p for p in sys.path if p not in ("", cwd, *pythonpath)]
    sys.path[:] = [*pythonpath, *keep]


def _guard_parent(supervisor_pid: int) -> None:
    """Die with the launcher: SIGKILL when the parent exits, and exit now if it already has
    (re-parented to init or to the supervisor, a subreaper)."""
    set_parent_death_signal()
    if os.getppid() in (1, supervisor_pid):
        os._exit(1)


#: The module namespaces as the fork launcher's parent saw them (:func:`before_fork`).
_PREBUILT: list[Any] = []


def before_fork(argv: list[str]) -> None:
    """Called by :mod:`cpmatrix.worker.forkrun` before it forks the ranks: the snapshot
    of every module namespace (:class:`~cpmatrix.worker.namespaces.NamespaceWatch`) is
    the same in every rank, so it is taken once, here, and inherited."""
    from cpmatrix.worker.namespaces import NamespaceWatch

    world = read_typed(argv[0], WorldSpec) if len(argv) == 1 else None
    if world is not None:
        install_p2p_counter()  # part of torch as every cell sees it (worker/hygiene.py)
        if world.prepare:
            _before_prepare(world)
        _PREBUILT.append(NamespaceWatch(world.project_roots))


def _before_prepare(world: WorldSpec) -> None:
    """The ``before_fork(world, installed)`` of the world's prepare module, if it has one:
    what every rank's prepare step would do alike (the pytest front: import the installed
    modules the test files import), done once. ``installed(path)``: a file of the standard
    library or of a non-editable distribution (what the cache's observer leaves out)."""
    module = importlib.import_module(world.prepare.partition(":")[0])
    hook = getattr(module, "before_fork", None)
    if callable(hook):
        classifier = warm()
        # What these imports read (a data or config file an installed module reads at
        # import) is every cell's input, as when each rank imported them itself.
        observer = ReadObserver(skip=(world.out_root, world.dir))
        observer.start()
        try:
            names = hook(world, lambda path: not classifier.observed(path))
        finally:
            reads = observer.stop()
        _PRELOAD_READS.update(reads if reads is not None else {
            "(the imports before the fork)": f"{UNOBSERVED}{observer.failed}"})
        print(f"cpmatrix worker: imported {len(names)} installed modules the world's "
              "prepare step needs before the fork", file=sys.stderr, flush=True)


#: What the imports before the fork read (:func:`_before_prepare`), for every rank's
#: observed set.
_PRELOAD_READS: dict[str, str] = {}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {WORLD_MAIN} WORLD.json", file=sys.stderr)
        return 2
    world = read_typed(args[0], WorldSpec)
    if world is None:
        print(f"cpmatrix worker: {args[0]}: not a world file", file=sys.stderr)
        return 2
    _guard_parent(world.supervisor_pid)
    # Orphans of this rank's case (double forks, daemons) come back to us, and die with us.
    set_child_subreaper()
    folder = WorldFolder(Path(world.dir))
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    log = _redirect_output(folder.rank_log(rank))
    faulthandler.enable(file=log, all_threads=True)  # segfaults leave a stack in the log
    folder.progress.mkdir(parents=True, exist_ok=True)
    write_typed(folder.pid_file(rank), PidFile(pid=os.getpid(), rank=rank, run=world.run_id))
    _fix_sys_path(list(world.pythonpath))

    import torch
    import torch.distributed as dist

    # What each cell reads completes the cache key (the run's own folder is the cells':
    # their working folders, HOME and TMPDIR are under it); the processes a cell starts
    # log theirs under the world's folder (cpmatrix.worker.follow).
    observer = ReadObserver(skip=(world.out_root, world.dir),
                            follow=os.path.join(world.dir, "follow"))
    observer.seen.update(_PRELOAD_READS)
    if world.prepare:
        # Before the baseline (the rank's isolation, below): what it sets up (the pytest
        # front's session, its imports and sys.path) is every cell's starting state, not
        # a cell's change. What it reads (the test modules' reads at import, conftests,
        # parametrize sources) is observed: every later cell's observed set holds it.
        observer.start()
        try:
            _prepare(world, rank)
        finally:
            observer.stop()

    if world.device == "cuda":
        torch.cuda.set_device(local_rank)
    timeout = datetime.timedelta(seconds=world.pg_timeout_s)
    store = dist.TCPStore(  # type: ignore[attr-defined]  # public, not re-exported in stubs
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
        timeout=timeout,
    )
    ranks = _Rank(world, rank, store, timeout, log, observer,
                  device_index=local_rank if world.device == "cuda" else None,
                  store_port=int(os.environ["MASTER_PORT"]))
    try:
        ranks.run()
    finally:
        ranks.close()
        kill_all(descendants(os.getpid()))  # whatever the cases started dies with the rank
    # Out of cells, maybe long before the other ranks: an exit the supervisor expects.
    write_typed(folder.left_file(rank), RankLeft(rank=rank, run=world.run_id))
    return 0


def _prepare(world: WorldSpec, rank: int) -> None:
    """Call ``world.prepare`` (``module:function``) as ``fn(world, rank)``.

    It must not raise (an error there is its cells' to report); if it does, the rank
    exits with the traceback in its log and the world counts as not started.
    """
    module_name, _, attr = world.prepare.partition(":")
    getattr(importlib.import_module(module_name), attr)(world, rank)


class _Rank:
    """One rank's life: its cells in the world file's order, each in its own environment,
    its process state restored or detected after, its groups checked."""

    def __init__(self, world: WorldSpec, rank: int, store: Any,
                 timeout: datetime.timedelta, log: TextIO, observer: ReadObserver,
                 device_index: int | None, store_port: int = 0) -> None:
        from cpmatrix.worker.isolation import CellIsolation

        self.world = world
        self.rank = rank
        self.store = store
        self.folder = WorldFolder(Path(world.dir))
        self.group = SubWorld(rank=rank, backend=world.backend, store=store, timeout=timeout,
                              device=world.device)
        # A rank may wait for its next cell while its peers run several others: the sum
        # of the world's timeouts bounds that (the supervisor's own per-cell timeouts
        # come first).
        self.wait = datetime.timedelta(
            seconds=world.pg_timeout_s + sum(c.timeout_s for c in world.cells))
        self.meshes: dict[tuple[int, int], Any] = {}
        self.dumper = StackDumper(self.folder.dump_request)
        threading.Thread(target=self.dumper.watch, name="cpmatrix-stacks", daemon=True).start()
        self.env = CellEnvironment(world_dir=world.dir, out_root=world.out_root,
                                   world_name=world.name, device_index=device_index)
        # The ledger wraps torch's point-to-point methods: before the namespaces'
        # snapshot, which then holds the wrappers as torch's own.
        self.ledger = GroupLedger()
        self.isolation = CellIsolation(project_roots=world.project_roots, log=log,
                                       namespaces=_PREBUILT[0] if _PREBUILT and not world.prepare
                                       else None)
        self.observer = observer
        self.store_port = store_port
        #: Set once a cell changed what cannot be restored: this process runs no more
        #: cells, it only tells the peers of its remaining cells to skip them.
        self.tainted = False

    def forget_meshes(self) -> None:
        for mesh in self.meshes.values():
            destroy_mesh(mesh)
        self.meshes.clear()
        clear_dtensor_caches()

    def run(self) -> None:
        for index, spec in enumerate(self.world.cells):
            ranks = self.world.ranks_of(index)
            if self.rank in ranks:
                self.cell(index, spec, ranks)

    def cell(self, index: int, spec: CellSpec, ranks: tuple[int, ...]) -> None:
        local, size = ranks.index(self.rank), len(ranks)
        # Waiting for this cell's peers: a stack dump asked for now is not the cell's.
        self.dumper.switch(self.folder.idle_stacks(self.rank))
        # Before the start marker: a group that cannot form is the world's fault,
        # never the cell's (the supervisor reruns the cell in a fresh world).
        decision = self.group.agree(index, ranks, stop=self.tainted, wait=self.wait)
        if decision == "skip":
            return
        if decision == "new":
            self.group.switch(index, ranks, self.forget_meshes)
        # The cell's folder on this rank: the case's ctx.out_dir, its stack dumps.
        stacks = Path(self.world.out_root, cell_stacks(spec.out_dir, local))
        stacks.parent.mkdir(parents=True, exist_ok=True)
        # On timeout the supervisor asks for stacks: they land in the cell's folder.
        self.dumper.switch(stacks)
        t_env = time.perf_counter()
        self.env.enter(spec.out_dir, local=local, size=size)
        env_s = time.perf_counter() - t_env
        write_typed(self.folder.marker(index, local, START), StartMarker(
            index=index, rank=local, id=spec.id, run=self.world.run_id, time=time.time(),
            log_offset=_log_offset()))
        self.isolation.before_cell()
        if self.world.backend == "gloo" and size > 1:
            # A case may cut the cell to end its peers' wait at once (worker/sever.py).
            sever.arm(self.store, index, local, size, self.store_port)
        self.observer.start()
        try:
            outcome, mesh = run_cell(self.world, index, spec, local, stacks.parent,
                                     self.meshes, self.ledger)
        finally:
            sever.disarm()
        outcome = dataclasses.replace(outcome, reads=self.observer.stop())
        t_after = time.perf_counter()
        self.env.leave()
        problems, failed = self.isolation.after_cell(self.world.dir, index, local)
        report, destroyed = self.ledger.after_case()
        t_checked = time.perf_counter()
        if problems:
            outcome = blame_state(outcome, problems, recycle=True)
        if destroyed:
            failed.append(f"the case destroyed process group(s) {', '.join(destroyed)}: the "
                          "next cell on these ranks would find them gone (leave the cell's "
                          "groups in place)")
        if failed:
            outcome = blame_state(outcome, failed, recycle=False)
        # Groups the cell used are judged with the peers' reports after the barrier.
        pending = outcome.ok and bool(report["groups"] or report["created"])
        outcome = dataclasses.replace(outcome, log_end=_log_offset(), end_time=time.time(),
                                      final=not pending)
        write_typed(self.folder.marker(index, local, DONE), outcome)
        t_b = time.perf_counter()
        mine = PeerReport(status=RECYCLE if problems else outcome.status, groups=report)
        peers = exchange(self.store, index, local, size, self.world.pg_timeout_s, mine)
        t_d = time.perf_counter()
        # A cut cell's groups are broken on purpose (worker/sever.py): made afresh, never
        # probed (a probe would blame the cell for the cut).
        cut = size > 1 and self.world.backend == "gloo" and sever.was_cut(self.store, index,
                                                                          size)
        clean = all(p.ok for p in peers.values()) and not cut
        verdict = judge({r: p.groups for r, p in peers.items()}) if clean else None
        t_probe = 0.0
        if pending:
            extra = list(verdict.blame.get(local, [])) if verdict else []
            if verdict is not None and verdict.probe:
                t_probe = time.perf_counter()
                extra += self.ledger.probe(verdict.probe, local, _PROBE_TIMEOUT_S)
                t_probe = time.perf_counter() - t_probe
            if extra:
                outcome = blame_state(outcome, extra, recycle=False)
                clean = False
            write_typed(self.folder.marker(index, local, DONE),
                        dataclasses.replace(outcome, final=True))
        if problems:
            # What the case changed cannot be undone here: no later cell may run in
            # this process (the supervisor reruns them in a fresh world).
            self.tainted = True
        self.keep_or_drop(spec, mesh, clean and not destroyed, verdict, report)
        if self.world.profile:
            parts = " ".join(f"{k}={1000 * v:.1f}ms" for k, v in self.isolation.timings.items())
            print(f"PROFILE env={1000*env_s:.1f}ms "
                  f"checks={1000*(t_checked-t_after):.1f}ms ({parts}) "
                  f"barrier={1000*(t_d-t_b):.1f}ms "
                  f"groups={1000*(time.perf_counter()-t_d):.1f}ms "
                  f"(probe={1000*t_probe:.1f}ms) "
                  f"setup={1000*outcome.setup_s:.1f}ms", file=sys.stderr)

    def keep_or_drop(self, spec: CellSpec, mesh: Any, clean: bool, verdict: Verdict | None,
                     report: dict[str, Any]) -> None:
        """Keep the cell's mesh and groups for the next cells, or let them go."""
        shape = (spec.rows, spec.cols)
        drop = set(verdict.drop) if verdict is not None else set()
        if clean and mesh is not None and not drop:
            # Every rank passed and the groups are proven drained: the next cell of this
            # shape on this group reuses the mesh (~25-40 ms on 9 ranks).
            self.meshes[shape] = mesh
            return
        import torch.distributed as dist

        world_group: Any = dist.group.WORLD
        default = world_group.group_name if world_group is not None else None
        if not clean or default in drop:
            # A failed cell may have left half-done collectives: the group itself is
            # made afresh for the next cell (and every mesh on it with it).
            self.group.dirty = True
        if mesh is not None:
            self.meshes.pop(shape, None)
            destroy_mesh(mesh)
        for other, cached in list(self.meshes.items()):
            if mesh_group_names(cached) & drop:
                self.meshes.pop(other)
                destroy_mesh(cached)
        destroy_groups(drop | set(report.get("created", [])))
        clear_dtensor_caches()

    def close(self) -> None:
        import torch.distributed as dist

        for mesh in self.meshes.values():
            destroy_mesh(mesh)
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception as exc:
            print(f"cpmatrix worker: destroy_process_group failed: {exc!r}", file=sys.stderr)


#: How long the barrier proving a used group drained may take (it takes milliseconds).
_PROBE_TIMEOUT_S = 60.0


if __name__ == "__main__":
    sys.exit(main())
