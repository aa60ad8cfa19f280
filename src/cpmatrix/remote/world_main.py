"""The code each rank of a world runs: many cells, several at once on disjoint ranks.

Usage (the supervisor builds this command)::

    python -m torch.distributed.run --nproc-per-node=4 ... -m cpmatrix.remote.world_main W.json

Imports only the standard library, torch and the worker-side part of cpmatrix
(:mod:`~cpmatrix.cell`, :mod:`~cpmatrix.fsutil`, :mod:`cpmatrix.remote`), so start-up stays
cheap and a crash here is easy to read.

The files it reads and writes are the typed ones of :mod:`cpmatrix.remote.protocol`: the
:class:`~cpmatrix.remote.protocol.WorldSpec` job file; per rank a
:class:`~cpmatrix.remote.protocol.PidFile` and its log (``rank<R>.log``, stdout+stderr);
per cell and rank (the rank *in the cell*) a :class:`~cpmatrix.remote.protocol.StartMarker`
*before* the cell runs and an :class:`~cpmatrix.remote.protocol.Outcome` *before* any
cross-rank step after it.

Each rank runs the cells placed on it (``WorldSpec.placement``, planned by
:mod:`cpmatrix.run.packing`) in the world file's order, each in a process group of the
cell's own ranks (:mod:`cpmatrix.remote.subworld`). After each cell the process state is
restored (:mod:`cpmatrix.remote.isolation`); when a case changed what cannot be restored,
that process runs no more cells: it tells the peers of each of its remaining cells to skip
it, then exits 0, and the supervisor runs the skipped cells in a fresh world.

The world group is never used by cases: each cell gets a fresh DeviceMesh whose groups
are destroyed in ``finally``, so a half-finished collective of one cell can never be
matched by the next cell's.
"""

from __future__ import annotations

import dataclasses
import datetime
import faulthandler
import importlib
import os
import random
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

from cpmatrix.cell import MESH_DIMS, TORCH_DTYPES, CellContext, seed_for
from cpmatrix.remote.procs import (
    descendants,
    kill_all,
    set_child_subreaper,
    set_parent_death_signal,
)
from cpmatrix.remote.protocol import (
    CellSpec,
    Outcome,
    PidFile,
    RankLeft,
    StartMarker,
    WorldSpec,
    marker_name,
    read_typed,
    write_typed,
)


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


def _reseed(seed: int) -> None:
    import torch

    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # numpy is optional for cases
        pass
    torch.manual_seed(seed)  # also seeds every CUDA device


class CaseModuleMismatch(ImportError):
    """The case module was imported from another file than the one the digest covers."""

    check = "case_module"


def _import_case(ref: str, expected_file: str) -> tuple[Any, str]:
    """The case function and the real path of the file its module was loaded from."""
    module_name, _, attr = ref.partition(":")
    module = importlib.import_module(module_name)
    ran = os.path.realpath(getattr(module, "__file__", None) or "")
    if expected_file and ran != os.path.realpath(expected_file):
        raise CaseModuleMismatch(
            f"case {ref!r}: module {module_name!r} was imported from {ran or 'nowhere'}, but "
            f"the cell's digest covers {expected_file}: another module of that name comes "
            "first on the path (the run refuses to report a verdict for other code)")
    try:
        return getattr(module, attr), ran
    except AttributeError:
        raise AttributeError(f"case {ref!r}: module {module_name!r} has no {attr!r}") from None


def _clear_dtensor_caches() -> None:
    """Forget DTensor's sharding and redistribution caches.

    DeviceMeshes of the same shape compare equal, so without this a cell's fresh mesh
    would hit cache entries holding the previous cell's (destroyed) groups:
    "Could not resolve the process group registered under the name 1". The caches
    are private, so each is cleared best-effort; a missing one is skipped.
    """
    import torch

    def attempt(fn: Any) -> None:
        try:
            fn()
        except Exception:
            pass

    attempt(lambda: torch._C._clear_DTensor_sharding_propagator_cache())
    try:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor import _redistribute as redistribute
    except ImportError:
        return
    prop: Any = getattr(getattr(DTensor, "_op_dispatcher", None), "sharding_propagator", None)
    attempt(lambda: prop.propagate_op_sharding.cache_clear())
    attempt(lambda: prop._propagate_tensor_meta_cached.cache_clear())
    attempt(lambda: redistribute._gen_transform_infos.cache_clear())
    attempt(lambda: redistribute.clear_redistribute_planner_cache())


def _destroy_mesh(mesh: Any) -> None:
    import torch.distributed as dist

    for dim in MESH_DIMS:
        try:
            group = mesh.get_group(dim)
        except Exception:  # the mesh never finished building
            continue
        if group is not None and group is not dist.group.WORLD:
            try:
                dist.destroy_process_group(group)
            except Exception as exc:  # never let cleanup mask the cell's own outcome
                print(f"cpmatrix worker: destroying {dim} group failed: {exc!r}",
                      file=sys.stderr)


def run_cell(
    world: WorldSpec, index: int, spec: CellSpec, rank: int,
    meshes: dict[tuple[int, int], Any] | None = None,
) -> tuple[Outcome, Any]:
    """Run one cell on this rank; return its outcome and its mesh (never raises).

    The mesh's groups are NOT destroyed here: a rank that is done must not tear down
    a group a peer is still waiting in (that would turn a peer's hang into a
    misleading "connection closed" error). The caller destroys them after the
    cross-rank barrier.
    """
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    out_dir = Path(world.out_root, spec.out_dir, f"rank{rank}")
    out_dir.mkdir(parents=True, exist_ok=True)
    seed = seed_for(spec.id)
    started = time.time()
    failure: dict[str, str] = {}
    ctx: CellContext | None = None
    mesh = None
    setup_s = case_s = 0.0
    try:
        _reseed(seed)
        if world.device == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        else:
            device = torch.device("cpu")
        shape = (spec.rows, spec.cols)
        mesh = (meshes or {}).get(shape)
        if mesh is None:
            mesh = init_device_mesh(world.device, shape, mesh_dim_names=MESH_DIMS)
        setup_s = time.time() - started
        case, case_file = _import_case(spec.case, spec.case_file)
        generator = torch.Generator(device="cpu")
        generator.manual_seed(seed)
        ctx = CellContext(
            id=spec.id, rank=rank, world_size=spec.world_size, mesh=mesh, device=device,
            backend=world.backend, dtype=getattr(torch, TORCH_DTYPES[spec.dtype]),
            dtype_name=spec.dtype, autocast=spec.autocast, path=spec.path, level=spec.level,
            params=dict(spec.params), seed=seed, generator=generator, out_dir=out_dir,
            platform=spec.platform, target=spec.target, mutant=spec.mutant or None,
        )
        ctx.record("case_file", case_file)  # which file ran: the one the digest covers
        t0 = time.perf_counter()
        try:
            case(ctx)
        finally:
            case_s = time.perf_counter() - t0
    except BaseException as exc:  # a case may raise anything; SystemExit too is a failure
        if isinstance(exc, KeyboardInterrupt):
            raise
        failure = {"exc_type": type(exc).__name__, "message": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc(),
                   "check": str(getattr(exc, "check", "") or "")}
        # Print it too: the rank's log is the first place people look.
        print(f"cpmatrix worker: cell {spec.id} failed on rank {rank}:\n"
              f"{failure['traceback']}", file=sys.stderr)
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    outcome = Outcome(
        index=index, rank=rank, id=spec.id, run=world.run_id,
        status="error" if failure else "ok", exc_type=failure.get("exc_type", ""),
        message=failure.get("message", ""), traceback=failure.get("traceback", ""),
        check=failure.get("check", ""), evidence=dict(ctx.evidence) if ctx is not None else {},
        setup_s=setup_s, case_s=case_s, duration_s=time.time() - started,
    )
    return outcome, mesh


def _barrier(store: Any, index: int, rank: int, size: int, timeout_s: float,
             status: str) -> bool:
    """Wait until every rank of cell ``index`` (``rank``: this one's in the cell) wrote
    its outcome; True when every one of them was ok.

    ``status`` is ``ok``, ``error`` or ``recycle`` (the process state cannot be
    restored). All the cell's ranks read the same keys, so they take the same decision.

    Uses the rendezvous TCPStore, never a collective: a collective here could be
    matched with one a peer is still blocked in inside the case.
    """
    import datetime as _dt

    store.set(f"cpmatrix/{index}/r{rank}", status)
    keys = [f"cpmatrix/{index}/r{r}" for r in range(size)]
    store.wait(keys, _dt.timedelta(seconds=timeout_s))
    return all(store.get(k) == b"ok" for k in keys)


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
    """Die with torchrun: SIGKILL when the parent exits, and exit now if it already has
    (re-parented to init or to the supervisor, a subreaper)."""
    set_parent_death_signal()
    if os.getppid() in (1, supervisor_pid):
        os._exit(1)


class _StackDumper:
    """Dumps every thread's stack into the current cell's ``stacks.txt`` on request.

    Two triggers: SIGUSR1 (faulthandler's C handler: works even while the GIL is
    held) and a request file ``<world>/dump.request`` polled by this thread, which
    works when the supervisor cannot signal us (a container's or sandbox's own pid
    namespace). Blocking collectives release the GIL, so the thread gets to run.
    """

    def __init__(self, request: Path) -> None:
        self.request = request
        self.file: TextIO | None = None
        self.seen = 0.0
        self.lock = threading.Lock()

    def switch(self, path: Path) -> None:
        new = open(path, "w", encoding="utf-8")  # noqa: SIM115 - lives until the next cell
        faulthandler.register(signal.SIGUSR1, file=new, all_threads=True)
        with self.lock:
            old, self.file = self.file, new
        if old is not None:
            old.close()

    def watch(self) -> None:
        while True:
            time.sleep(0.2)
            try:
                stamp = self.request.stat().st_mtime
            except OSError:
                continue
            if stamp > self.seen:
                self.seen = stamp
                with self.lock:
                    if self.file is not None:
                        faulthandler.dump_traceback(file=self.file, all_threads=True)
                        self.file.flush()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m cpmatrix.remote.world_main WORLD.json", file=sys.stderr)
        return 2
    world = read_typed(args[0], WorldSpec)
    if world is None:
        print(f"cpmatrix worker: {args[0]}: not a world file", file=sys.stderr)
        return 2
    _guard_parent(world.supervisor_pid)
    # Orphans of this rank's case (double forks, daemons) come back to us, and die with us.
    set_child_subreaper()
    world_dir = Path(world.dir)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    log = _redirect_output(world_dir / f"rank{rank}.log")
    faulthandler.enable(file=log, all_threads=True)  # segfaults leave a stack in the log
    progress = world_dir / "progress"
    progress.mkdir(parents=True, exist_ok=True)
    write_typed(world_dir / f"rank{rank}.pid", PidFile(pid=os.getpid(), rank=rank,
                                                       run=world.run_id))
    _fix_sys_path(list(world.pythonpath))

    import torch
    import torch.distributed as dist

    from cpmatrix.remote.isolation import CellIsolation
    from cpmatrix.remote.subworld import SubWorld

    if world.prepare:
        # Before the baseline below: what it sets up (the pytest front's session, its
        # imports and sys.path) is every cell's starting state, not a cell's change.
        _prepare(world, rank)

    if world.device == "cuda":
        torch.cuda.set_device(local_rank)
    timeout = datetime.timedelta(seconds=world.pg_timeout_s)
    store = dist.TCPStore(  # type: ignore[attr-defined]  # public, not re-exported in stubs
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
        timeout=timeout,
    )
    group = SubWorld(rank=rank, backend=world.backend, store=store, timeout=timeout,
                     device=world.device)
    # A rank may wait for its next cell while its peers run several others: the sum of
    # the world's timeouts bounds that (the supervisor's own per-cell timeouts come first).
    wait = datetime.timedelta(
        seconds=world.pg_timeout_s + sum(c.timeout_s for c in world.cells))
    meshes: dict[tuple[int, int], Any] = {}

    def forget_meshes() -> None:
        for mesh in meshes.values():
            _destroy_mesh(mesh)
        meshes.clear()
        _clear_dtensor_caches()

    dumper = _StackDumper(world_dir / "dump.request")
    threading.Thread(target=dumper.watch, name="cpmatrix-stacks", daemon=True).start()
    isolation = CellIsolation(project_roots=world.project_roots)
    # Set once a cell changed what cannot be restored: this process runs no more cells,
    # it only tells the peers of its remaining cells to skip them (they rerun elsewhere).
    tainted = False
    try:
        for index, spec in enumerate(world.cells):
            ranks = world.ranks_of(index)
            if rank not in ranks:
                continue
            local = ranks.index(rank)
            # Waiting for this cell's peers: a stack dump asked for now is not the cell's.
            dumper.switch(world_dir / f"rank{rank}.idle-stacks.txt")
            # Before the start marker: a group that cannot form is the world's fault,
            # never the cell's (the supervisor reruns the cell in a fresh world).
            decision = group.agree(index, ranks, stop=tainted, wait=wait)
            if decision == "skip":
                continue
            if decision == "new":
                group.switch(index, ranks, forget_meshes)
                isolation.rebase_world()  # the new group is what a case must not touch
            cell_dir = Path(world.out_root, spec.out_dir, f"rank{local}")
            cell_dir.mkdir(parents=True, exist_ok=True)
            # On timeout the supervisor asks for stacks: they land in the cell's folder.
            dumper.switch(cell_dir / "stacks.txt")
            write_typed(progress / marker_name(index, local, "start"), StartMarker(
                index=index, rank=local, id=spec.id, run=world.run_id, time=time.time(),
                log_offset=_log_offset()))
            isolation.before_cell()
            outcome, mesh = run_cell(world, index, spec, local, meshes)
            problems = isolation.after_cell()
            if problems:
                outcome = _blame_state(outcome, problems)
            outcome = dataclasses.replace(outcome, log_end=_log_offset(), end_time=time.time())
            write_typed(progress / marker_name(index, local, "done"), outcome)
            t_b = time.perf_counter()
            status = "recycle" if problems else ("ok" if outcome.ok else "error")
            clean = _barrier(store, index, local, len(ranks), world.pg_timeout_s, status)
            t_d = time.perf_counter()
            if problems:
                # What the case changed cannot be undone here: no later cell may run in
                # this process (the supervisor reruns them in a fresh world).
                tainted = True
            shape = (spec.rows, spec.cols)
            if mesh is not None and clean:
                # Every rank passed: no collective can be pending on this mesh, so the
                # next cell of this shape on this group reuses it (~25-40 ms on 9 ranks).
                meshes[shape] = mesh
            else:
                # A failed cell may have left half-done collectives: its mesh goes, and
                # DTensor's caches with it (they would resolve the destroyed groups);
                # the group itself is made afresh for the next cell.
                group.dirty = True
                if mesh is not None:
                    meshes.pop(shape, None)
                    _destroy_mesh(mesh)
                    _clear_dtensor_caches()
            if os.environ.get("CPMATRIX_PROFILE"):
                print(f"PROFILE barrier={1000*(t_d-t_b):.1f}ms "
                      f"teardown={1000*(time.perf_counter()-t_d):.1f}ms "
                      f"setup={1000*outcome.setup_s:.1f}ms", file=sys.stderr)
    finally:
        for mesh in meshes.values():
            _destroy_mesh(mesh)
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception as exc:
            print(f"cpmatrix worker: destroy_process_group failed: {exc!r}", file=sys.stderr)
        kill_all(descendants(os.getpid()))  # whatever the cases started dies with the rank
    # Out of cells, maybe long before the other ranks: an exit the supervisor expects.
    write_typed(world_dir / f"rank{rank}.left", RankLeft(rank=rank, run=world.run_id))
    return 0


def _prepare(world: WorldSpec, rank: int) -> None:
    """Call ``world.prepare`` (``module:function``) as ``fn(world, rank)``.

    It must not raise (an error there is its cells' to report); if it does, the rank
    exits with the traceback in its log and the world counts as not started.
    """
    module_name, _, attr = world.prepare.partition(":")
    getattr(importlib.import_module(module_name), attr)(world, rank)


def _blame_state(outcome: Outcome, problems: list[str]) -> Outcome:
    """Fail the cell that changed what cannot be restored (check ``process_state``)."""
    message = "process_state: " + "; ".join(problems)
    print(f"cpmatrix worker: cell {outcome.id} on rank {outcome.rank}: {message}; the world "
          "is recycled after this cell", file=sys.stderr)
    if outcome.ok:
        return dataclasses.replace(outcome, status="error", exc_type="ProcessStateError",
                                   message=message, traceback="", check="process_state",
                                   recycle=True)
    # Keep the case's own error first; the state problem is part of the story.
    return dataclasses.replace(outcome, message=f"{outcome.message}; {message}", recycle=True)


if __name__ == "__main__":
    sys.exit(main())
