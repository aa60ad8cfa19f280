"""A local launcher that pays for ``import torch`` once: a "zygote" that forks the ranks.

Usage (the supervisor builds this command, in place of ``torch.distributed.run``)::

    python -m cpmatrix.worker.forkrun --nproc-per-node=4 --master-port=29500 \\
        --root-cause-file=W/root_cause.json -m cpmatrix.worker.world_main W/world.json

``python -m cpmatrix.worker.forkrun --adopt`` is a *spare*: it imports what every world
needs, then reads its world's command (arguments, environment, folder, log) as one JSON
line on stdin and goes on as above (:mod:`cpmatrix.supervise.executors.spare`).

The parent imports torch, ``torch.distributed``, the DTensor modules and the target
module, then forks one child per rank. Each child gets torchrun's variables (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``, ...) and calls the target
module's ``main(argv)``. The parent then hosts the rendezvous store (as torchrun's agent
does) and watches the ranks: the first rank that fails is written as a typed
:class:`~cpmatrix.worker.protocol.RootCause` (``--root-cause-file``, what the supervisor
reads) and named in a torchrun-style "Root Cause" block in the launcher's log (for
people), and the others are killed.

Forking is only safe before any thread exists: the parent checks that it is still the
only thread (``/proc/self/task``; torch's intra-op pool and CUDA start threads) and that
CUDA is not initialized, and refuses to fork otherwise (exit 3, before any rank exists).
Every guarantee of a torchrun world holds: each rank gets the parent-death signal (it
dies with the launcher, which dies with cpmatrix), SIGTERM/SIGINT to the launcher kill
the ranks, and ranks stay in the launcher's process group and environment (the world
token), so the supervisor's sweep finds them.

Example::

    >>> _parse(["--nproc-per-node=2", "--master-port=1", "-m", "m", "a"]).nproc
    2
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from typing import Any

from cpmatrix.module_names import FORKRUN
from cpmatrix.worker.procs import set_parent_death_signal
from cpmatrix.worker.protocol import RootCause, write_typed

#: Modules every rank needs; importing them before the fork is the point of the launcher.
#: ``torch._dynamo`` is imported lazily by DTensor's first operation (its dispatch is
#: wrapped in ``torch._disable_dynamo``): 1.3 s of a 1-rank world's first cell, paid by
#: every rank at once on a few cores. ``torch.testing`` is what parity checks call.
_PRELOAD = ("torch", "torch.distributed", "torch.distributed.device_mesh",
            "torch.distributed.tensor", "torch._dynamo", "torch.testing")


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=f"python -m {FORKRUN}")
    ap.add_argument("--nproc-per-node", dest="nproc", type=int, required=True)
    ap.add_argument("--master-addr", default="127.0.0.1")
    ap.add_argument("--master-port", type=int, required=True)
    ap.add_argument("--root-cause-file", default="",
                    help="where to write the first failing rank (a RootCause)")
    ap.add_argument("--run-id", default="", help="the run the RootCause belongs to")
    ap.add_argument("-m", dest="module", required=True)
    ap.add_argument("args", nargs=argparse.REMAINDER)
    return ap.parse_args(argv)


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: cannot tell; assume the worst
        return -1


def _rank_env(rank: int, n: int, addr: str, port: int) -> dict[str, str]:
    """What torchrun gives a single-node rank (the subset world_main and c10d read)."""
    return {
        "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
        "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "ROLE_WORLD_SIZE": str(n),
        "MASTER_ADDR": addr, "MASTER_PORT": str(port),
        # The store lives in this launcher (it outlives any one rank, as torchrun's does).
        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "cpmatrix",
    }


def _child(rank: int, args: argparse.Namespace, target: Any) -> None:
    """The rank's whole life after the fork; never returns."""
    code = 1
    try:
        set_parent_death_signal()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        if os.getppid() == 1:  # the launcher died between fork and prctl
            os._exit(1)
        os.environ.update(_rank_env(rank, args.nproc, args.master_addr, args.master_port))
        sys.argv = [args.module, *args.args]
        result = target.main(list(args.args))
        code = result if isinstance(result, int) else 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


_SPAWNED: list[Any] = []
#: A spawned rank: the target module's ``main(argv)``, as a forked rank calls it.
_SPAWNED_MAIN = ("import importlib, os, sys\n"
                 "code = importlib.import_module(sys.argv[1]).main(sys.argv[2:])\n"
                 "sys.stdout.flush(); sys.stderr.flush()\n"
                 "os._exit(code if isinstance(code, int) else 0)\n")


def _spawn(args: argparse.Namespace) -> dict[int, int]:
    """Each rank a new interpreter calling the target module's ``main`` (which sets its
    own parent-death signal: ``world_main``); pid -> rank."""
    import subprocess

    pids: dict[int, int] = {}
    for rank in range(args.nproc):
        env = {**os.environ, **_rank_env(rank, args.nproc, args.master_addr, args.master_port)}
        proc = subprocess.Popen([sys.executable, "-c", _SPAWNED_MAIN, args.module, *args.args],
                                env=env)
        _SPAWNED.append(proc)  # reaped by _supervise's waitpid; kept from the collector
        pids[proc.pid] = rank
    return pids


def _root_cause(run: str, rank: int, pid: int, status: int) -> RootCause:
    return RootCause(run=run, rank=rank, exitcode=os.waitstatus_to_exitcode(status), pid=pid,
                     time=time.time())


def _root_cause_text(cause: RootCause) -> str:
    """The record as torchrun prints its own (people know that block from torchrun)."""
    when = time.strftime("%Y-%m-%d_%H:%M:%S", time.localtime(cause.time))
    return ("Root Cause (first observed failure):\n"
            f"[0]:\n  time      : {when}\n"
            f"  rank      : {cause.rank} (local_rank: {cause.rank})\n"
            f"  exitcode  : {cause.exitcode} (pid: {cause.pid})\n")


def _adopted() -> list[str] | None:
    """``--adopt``: wait for the world, one JSON line on stdin (``argv``: this launcher's
    arguments, ``env``, ``cwd``, ``log``), and become its launcher: its environment, its
    folder, its log. None at end of input (no world took this spare)."""
    line = sys.stdin.buffer.readline()
    if not line:
        return None
    world = json.loads(line)
    os.chdir(world["cwd"])
    os.environ.clear()
    os.environ.update(world["env"])
    tempfile.tempdir = None  # gettempdir() caches its first answer: the spare's TMPDIR
    # What torch read from the folder it was imported in: the world's, as a launcher
    # started in the world's folder has it (TORCH_COMPILE_DEBUG's output).
    dynamo = sys.modules.get("torch._dynamo.config")
    if dynamo is not None:
        setattr(dynamo, "debug_dir_root",  # noqa: B010  (a module: no typed attribute)
                os.path.join(os.getcwd(), "torch_compile_debug"))
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(world["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return [str(a) for a in world["argv"]]


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw == ["--adopt"]:
        # A spare, started before its world was planned (cpmatrix.supervise.executors.spare):
        # the imports first, while the run plans; then the world's command.
        set_parent_death_signal()
        for name in _PRELOAD:
            importlib.import_module(name)
        adopted = _adopted()
        if adopted is None:
            return 0
        raw = adopted
    args = _parse(raw)
    if args.nproc < 1:
        print("forkrun: --nproc-per-node must be >= 1", file=sys.stderr)
        return 2
    set_parent_death_signal()
    for name in _PRELOAD:
        importlib.import_module(name)
    target = importlib.import_module(args.module)
    # What every rank would build alike right after the fork (world_main's snapshot of
    # the module namespaces, ~0.1-0.4 s): built once here, inherited by the ranks.
    prepare = getattr(target, "before_fork", None)
    import torch

    alone = _threads() == 1 and not torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    if callable(prepare):
        prepare(list(args.args))
    threads = _threads()
    cuda = bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]
    if alone and (threads != 1 or cuda):
        # What ``before_fork`` imported for the ranks started a thread or CUDA: start
        # each rank as a fresh interpreter instead (as torchrun does; slower, never unsafe).
        print(f"forkrun: {threads} threads, cuda initialized: {cuda} after the world's "
              "imports; starting the ranks as new processes instead of forking",
              file=sys.stderr, flush=True)
        return _supervise(_spawn(args), args)
    if threads != 1 or cuda:
        # A forked child gets only the forking thread: a lock another thread held (an
        # OpenMP pool, CUDA's) would stay locked forever in every rank.
        print(f"forkrun: refusing to fork: {threads} threads, cuda initialized: "
              f"{cuda}; use --launcher torchrun", file=sys.stderr)
        return 3
    sys.stdout.flush()
    sys.stderr.flush()
    pids: dict[int, int] = {}
    for rank in range(args.nproc):
        pid = os.fork()
        if pid == 0:
            _child(rank, args, target)
        pids[pid] = rank
    return _supervise(pids, args)


def _supervise(pids: dict[int, int], args: argparse.Namespace) -> int:
    """Host the store, wait for the ranks; the first failure ends the world."""
    stopping: list[int] = []
    live = dict(pids)

    def stop(signum: int, _frame: Any) -> None:
        stopping.append(signum)
        _kill(live)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    import datetime

    import torch.distributed as dist

    try:
        store = dist.TCPStore(  # type: ignore[attr-defined]  # public, not in the stubs
            args.master_addr, args.master_port, world_size=args.nproc, is_master=True,
            wait_for_workers=False, timeout=datetime.timedelta(seconds=300))
    except Exception as exc:  # port taken: no rank can start; the supervisor retries
        print(f"forkrun: cannot host the store on port {args.master_port}: {exc}",
              file=sys.stderr)
        _kill(pids)
        return 1
    failed = 0
    while live:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        rank = live.pop(pid, None)
        if rank is None:
            continue
        if status != 0 and not failed and not stopping:
            failed = 1
            cause = _root_cause(args.run_id, rank, pid, status)
            if args.root_cause_file:  # before the kill: the supervisor may read it at once
                # Evidence only: without it the supervisor names the rank by its pid.
                with contextlib.suppress(OSError):
                    write_typed(args.root_cause_file, cause)
            print(_root_cause_text(cause), file=sys.stderr, flush=True)
            _kill(live)
    del store  # closes the listening socket before this process exits
    return 128 + stopping[0] if stopping else failed


def _kill(pids: dict[int, int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown of torch (a second or more on a loaded machine):
    # the ranks are reaped, the store is closed, nothing is left to clean up.
    os._exit(code)
