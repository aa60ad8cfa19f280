"""Adversarial neighbours for tests/worlds/test_isolation.py (issue 21, rows 1-3 and 8-12).

Each ``leave_*`` case changes something process-wide (or leaves something behind) and
passes; the case after it on the same ranks gets its true verdict only when cpmatrix put
the change back, or failed the leaver itself. The ``*_victim`` cases are the ones a leak
would fool: each fails (or passes) exactly as it would alone.
"""

import json
import locale
import logging
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy
import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import cpmatrix.parity.compare


def _out_root(cell) -> Path:
    return Path(cell.out_dir).parents[2]  # <out>/cells/<cell>/rank<r>


def _world_rank(cell) -> int:
    for path in (_out_root(cell) / "worlds").glob("*/rank*.pid"):
        if json.loads(path.read_text())["pid"] == os.getpid():
            return int(path.name[4:-4])
    raise AssertionError("no pid file names this process")


# ---------------------------------------------------------------- row 1: the environment

RANK_VARS = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
             "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def env_check(cell):
    """The rank variables are those of a world of the cell's own size, whatever ranks of
    the launched world the cell runs on and whatever ran there before."""
    env = {k: os.environ.get(k) for k in RANK_VARS}
    cell.record("world_rank", _world_rank(cell))
    cell.record("pid", os.getpid())
    cell.record("group", id(dist.group.WORLD))
    for key, value in env.items():
        cell.record(f"env_{key}", str(value))
    want = {"RANK": str(cell.rank), "LOCAL_RANK": str(cell.rank), "GROUP_RANK": "0",
            "ROLE_RANK": str(cell.rank), "WORLD_SIZE": str(cell.world_size),
            "LOCAL_WORLD_SIZE": str(cell.world_size), "GROUP_WORLD_SIZE": "1",
            "ROLE_WORLD_SIZE": str(cell.world_size)}
    wrong = {k: (env[k], v) for k, v in want.items() if env[k] != v}
    assert not wrong, f"not the environment of a {cell.world_size}-rank world: {wrong}"
    assert env["MASTER_ADDR"] and env["MASTER_PORT"], env
    assert dist.get_rank() == int(env["RANK"]) and dist.get_world_size() == cell.world_size
    os.environ["RANK"] = "99"  # a case may change its own environment: never the next's
    os.environ.pop("WORLD_SIZE")


# ------------------------------------------------------ row 3: working folder, HOME, TMPDIR

def _places() -> list[Path]:
    return [Path.cwd(), Path(os.environ["HOME"]), Path(tempfile.gettempdir())]


def ckpt_writer(cell):
    """Writes a checkpoint where a training script would: its working folder, HOME and
    the temp folder. With slots, says so to the reader beside it."""
    for place in _places():
        torch.save({"w": torch.ones(3)}, place / f"ckpt{cell.rank}.pt")
    dist.barrier()  # every rank wrote its own
    if cell.rank == 0:
        meet = _out_root(cell) / "meet"
        meet.mkdir(exist_ok=True)
        (meet / "written").write_text("")


def ckpt_reader(cell):
    """Never writes a checkpoint, yet loads one: passes only on a neighbour's file (as
    the bug of row 3). Alone it fails with FileNotFoundError."""
    meet = _out_root(cell) / "meet"
    deadline = time.monotonic() + 20
    while not (meet / "written").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # with slots the writer runs beside: wait until it wrote
    for place in _places():
        torch.load(place / f"ckpt{cell.rank}.pt")
    cell.record("loaded", True)


def folders(cell):
    """Fresh, empty, the cell's own (under its folder), shared by its ranks."""
    cwd, home, tmp = _places()
    for name, place in (("cwd", cwd), ("home", home), ("tmp", tmp)):
        cell.record(f"{name}_empty", not any(p for p in place.iterdir()
                                             if not p.name.startswith("shared")))
        cell.record(f"{name}_in_cell_folder", str(place).startswith(
            str(Path(cell.out_dir).parent)))
    cell.record("distinct", len({cwd, home, tmp}) == 3)
    if cell.rank == 0:
        (cwd / "shared-by-rank0").write_text("hello")
    dist.barrier()
    cell.record("shared_with_rank0", (cwd / "shared-by-rank0").exists())
    dist.barrier()


# ----------------------------------------------------------------------- row 2: forks

def fork_returns(cell):
    """The classic bug: the child falls through and returns out of the case."""
    pid = os.fork()
    if pid == 0:
        (cell.out_dir / "child-pid").write_text(str(os.getpid()))
        return  # the child carries on as if it were the rank
    os.waitpid(pid, 0)


def fork_raises(cell):
    pid = os.fork()
    if pid == 0:
        raise ValueError("the child's own error")
    os.waitpid(pid, 0)


def fork_sys_exit(cell):
    """A child ending with sys.exit(0): its own business; the case checks its status."""
    pid = os.fork()
    if pid == 0:
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    cell.record("child_exit", os.waitstatus_to_exitcode(status))


def _mp_target(path):
    Path(path).write_text("ran")
    sys.exit(0)


def multiprocessing_fork(cell):
    ctx = multiprocessing.get_context("fork")
    path = cell.out_dir / "mp-ran"
    proc = ctx.Process(target=_mp_target, args=(str(path),))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0 and path.read_text() == "ran", proc.exitcode
    cell.record("mp_exit", proc.exitcode)


def leave_children(cell):
    """Leaves a subprocess and a forked child running; writes their pids."""
    child = subprocess.Popen(["sleep", "600"])
    pid = os.fork()
    if pid == 0:
        while True:
            time.sleep(0.05)
    (cell.out_dir / "left.json").write_text(json.dumps([child.pid, pid]))


def no_children(cell):
    """The rank has no children left from an earlier cell."""
    me = os.getpid()
    kids = []
    for tid in os.listdir(f"/proc/{me}/task"):
        kids += Path(f"/proc/{me}/task/{tid}/children").read_text().split()
    cell.record("children", len(kids))
    assert not kids, f"children of an earlier cell still run: {kids}"


# ---------------------------------------------------- rows 8, 12 and the other settings

class _AllClose(TorchFunctionMode):
    """Makes every isclose say "close": a mode left entered passes any mismatch."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.isclose:
            return torch.ones_like(args[0], dtype=torch.bool)
        return func(*args, **(kwargs or {}))


class _Count(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _on_usr2(signum, frame):  # a handler a case installs and forgets
    pass


def leave_settings(cell):
    """Changes every process-wide setting a case plausibly forgets, and passes."""
    _AllClose().__enter__()
    _Count().__enter__()
    torch.set_flush_denormal(True)
    torch.set_default_dtype(torch.float64)
    torch.autocast("cpu").__enter__()
    torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t).__enter__()
    torch.set_num_threads(1)
    torch.backends.cuda.enable_flash_sdp(False)
    sys.setrecursionlimit(54321)
    numpy.seterr(all="raise")
    signal.signal(signal.SIGUSR2, _on_usr2)
    warnings.simplefilter("error")
    os.umask(0o077)
    os.putenv("CPMATRIX_PUTENV_LEAK", "1")
    socket.setdefaulttimeout(3.0)
    logging.disable(logging.CRITICAL)
    sys.path.insert(0, "/nonexistent-cpmatrix-path")
    locale.setlocale(locale.LC_ALL, "C")


def settings_fingerprint(cell):
    """What the settings are when a cell starts; fails when any leaked."""
    probe = torch.tensor([1e-40], dtype=torch.float32)
    mask = os.umask(0o022)
    os.umask(mask)
    env = subprocess.run(["env"], capture_output=True, text=True, check=True).stdout
    state = {
        "function_modes": torch._C._len_torch_function_stack(),
        "dispatch_modes": torch._C._len_torch_dispatch_stack(),
        "denormal_survives": float(probe.mul(1.0)[0]) != 0.0,
        "default_dtype": str(torch.get_default_dtype()),
        "autocast_cpu": torch.is_autocast_enabled("cpu"),
        "saved_tensor_hooks": torch._C._autograd._top_saved_tensors_default_hooks(True)
        is not None,
        "flash_sdp": torch.backends.cuda.flash_sdp_enabled(),
        "recursionlimit": sys.getrecursionlimit(),
        "numpy_over": numpy.geterr()["over"],
        "sigusr2_default": signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL,
        "warnings_error": any(f[0] == "error" for f in warnings.filters[:1]),
        "umask": mask,
        "putenv_leak": "CPMATRIX_PUTENV_LEAK" in env,
        "socket_timeout": socket.getdefaulttimeout() is None,
        "logging_disabled": logging.root.manager.disable,
        "bad_sys_path": "/nonexistent-cpmatrix-path" in sys.path,
    }
    for key, value in state.items():
        cell.record(key, value if isinstance(value, bool | int | float | str) else str(value))
    expect = {"function_modes": 0, "dispatch_modes": 0, "denormal_survives": True,
              "default_dtype": "torch.float32", "autocast_cpu": False,
              "saved_tensor_hooks": False, "flash_sdp": True, "recursionlimit": 1000,
              "numpy_over": "warn", "sigusr2_default": True, "warnings_error": False,
              "putenv_leak": False, "socket_timeout": True, "logging_disabled": 0,
              "bad_sys_path": False}
    leaked = {k: state[k] for k, v in expect.items() if state[k] != v}
    assert not leaked, f"state leaked from an earlier cell: {leaked}"


def half_mismatch_victim(cell):
    """A real 50% mismatch: fails unless a mode left entered says "close"."""
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])
    b = torch.tensor([1.0, 2.0, 30.0, 40.0])
    torch.testing.assert_close(a, b)


def denormal_victim(cell):
    """Works with a float32 denormal: fails when flush-denormal leaked in."""
    x = torch.tensor([1e-40], dtype=torch.float32)
    y = float((x * 1.0)[0])
    cell.record("denormal", y)
    assert y != 0.0, "a float32 denormal was flushed to zero"


# ----------------------------------------------------- row 9 and an installed package

def patch_parity(cell):
    """Makes cpmatrix's own compare say "no differences", and passes."""
    cpmatrix.parity.compare.compare_named = lambda pairs, tol: []


def parity_victim(cell):
    """A real 2x output error through cpmatrix.parity's compare: fails (as alone)."""
    from cpmatrix.parity.tolerance import tolerance_for

    out = torch.ones(4, dtype=torch.float64)
    diffs = cpmatrix.parity.compare.compare_named({"out": (2 * out, out)},
                                                  tolerance_for(torch.float64))
    bad = [d for d in diffs if not d.ok]
    cell.record("diffs", len(diffs))
    assert bad, "compare_named saw no difference in a 2x output error"
    raise AssertionError(f"2x output error: {bad[0].line()}")


def patch_installed(cell):
    """Patches an installed package other than torch (numpy), and passes."""
    numpy.allclose = lambda *args, **kwargs: True


def installed_victim(cell):
    x = numpy.arange(4.0)
    assert numpy.allclose(x, 2 * x), "2x error (numpy.allclose)"


def leave_thread(cell):
    """Leaves a (non-daemon) thread running past the cell."""
    stop = threading.Event()
    threading.Thread(target=stop.wait, args=(30,), name="left-behind").start()


# ------------------------------------------------------------- rows 10 and 11: groups

def pending_isend(cell):
    """Rank 0 sends what nobody receives and passes: its group must not reach the next
    cell (whose receive would get this stale tensor, or wait forever)."""
    if cell.rank == 0:
        dist.isend(torch.full((4,), 666.0), 1)


def p2p_victim(cell):
    """A matched send/recv on the default group, tag 0: gets exactly what was sent."""
    t = torch.arange(4, dtype=torch.float32)
    if cell.rank == 0:
        dist.send(t, 1)
    elif cell.rank == 1:
        got = torch.zeros(4)
        dist.recv(got, 0)
        cell.record("received", float(got.sum()))
        assert torch.equal(got, t), f"received {got.tolist()}, not what was sent"
    dist.barrier()


def destroy_subgroup(cell):
    """Destroys one of its mesh's groups and passes."""
    dist.destroy_process_group(cell.mesh.get_group("cp0"))


def subgroup_victim(cell):
    """Uses every group of its mesh, through DTensor too."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    x = torch.arange(16.0).reshape(4, 4)
    d = distribute_tensor(x, cell.mesh, [Shard(0), Shard(1)])
    assert torch.equal(d.redistribute(cell.mesh, [Replicate(), Replicate()]).to_local(), x)
    for dim in ("cp0", "cp1"):
        t = torch.ones(1)
        dist.all_reduce(t, group=cell.mesh.get_group(dim))
        assert t.item() == cell.mesh.size(0 if dim == "cp0" else 1)
    cell.record("ok", True)


def collectives_only(cell):
    """Async collectives on every group, some never waited on: matched, so drained."""
    for dim in ("cp0", "cp1"):
        dist.all_reduce(torch.ones(2), group=cell.mesh.get_group(dim), async_op=True)
    dist.all_reduce(torch.ones(2))
