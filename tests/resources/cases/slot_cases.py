"""Cases for tests/resources/slots.yaml: cells that can only pass when they run at the same
time as a partner cell, on other ranks of the same world.

Rank 0 of a cell writes ``<out>/meet/<me>`` and waits for its partner's file: run one
after the other (no slots), the first one waits in vain and fails. Each cell also records
which world ranks and which process group it ran on.
"""

import atexit
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

#: How long rank 0 waits for its partner to be running.
MEET_S = 8.0


def _out_root(cell) -> Path:
    return Path(cell.out_dir).parents[2]  # <out>/cells/<cell>/rank<r>


def _world_rank(cell) -> int:
    """This process's rank in the launched world (from the world folders' pid files)."""
    for path in (_out_root(cell) / "worlds").glob("*/rank*.pid"):
        if json.loads(path.read_text())["pid"] == os.getpid():
            return int(path.name[4:-4])
    raise AssertionError("no pid file names this process")


def _say(cell, me: str) -> Path:
    """Say ``me`` is running (a file in ``<out>/meet``); the folder."""
    meet = _out_root(cell) / "meet"
    meet.mkdir(exist_ok=True)
    (meet / me).write_text(str(time.time()))
    return meet


def _await(meet: Path, me: str, partners: tuple[str, ...]) -> None:
    """Wait until one of ``partners`` says it is running; fail after ``MEET_S``."""
    deadline = time.monotonic() + MEET_S
    while not any((meet / p).exists() for p in partners):
        if time.monotonic() > deadline:
            raise AssertionError(f"{me}: {' or '.join(partners)} did not run at the same time")
        time.sleep(0.02)


def _meet(cell, me: str, partner: str) -> None:
    """Rank 0 says it is running and waits until the partner cell says so too."""
    if cell.rank == 0:
        _await(_say(cell, me), me, (partner,))
    dist.barrier()  # every rank of the cell leaves together, in the cell's own group


def _record_group(cell) -> None:
    """The group is exactly the cell's ranks; a derived (flattened) mesh works on it."""
    cell.record("world_rank", _world_rank(cell))
    cell.record("dist_world_size", dist.get_world_size())
    cell.record("env_world_size", int(os.environ["WORLD_SIZE"]))
    cell.record("env_rank", int(os.environ["RANK"]))
    assert dist.get_world_size() == cell.world_size == cell.mesh.size()
    assert dist.get_rank() == cell.rank == int(os.environ["RANK"])
    flat = cell.mesh._flatten("flat")  # a new_group call that involves only this cell's ranks
    t = torch.ones(1, dtype=torch.float64)
    dist.all_reduce(t, group=flat.get_group())
    cell.record("flat_sum", float(t.item()))
    assert t.item() == cell.world_size


def wide(cell):
    """A cell of every rank of the world (it makes the world that wide)."""
    _record_group(cell)


def meet_a(cell):
    _meet(cell, "a", "b")
    _record_group(cell)


def meet_b(cell):
    _meet(cell, "b", "a")
    _record_group(cell)


def crash_beside(cell):
    """Meets ``beside``, then its rank 1 dies."""
    _meet(cell, "crash", "beside")
    if cell.rank == 1:
        os._exit(13)
    dist.barrier()


def hang_beside(cell):
    """Meets ``beside``, then rank 0 hangs past the cell's timeout."""
    _meet(cell, "hang", "beside")
    if cell.rank == 0:
        time.sleep(120)
    dist.barrier()


def error_beside(cell):
    """Meets ``beside``, then rank 0 raises while rank 1 waits for it in a collective."""
    _meet(cell, "error", "beside")
    if cell.rank == 0:
        raise ValueError("planted error beside another cell")
    dist.barrier()


def patch_beside(cell):
    """Meets ``beside``, then replaces torch.testing.assert_close (cannot be restored)."""
    _meet(cell, "patch", "beside")
    torch.testing.assert_close = lambda *args, **kwargs: None


def beside(cell):
    """The innocent neighbour: meets whichever fault runs beside it, then takes a while
    (so the fault is seen while it still runs) and passes."""
    if cell.rank == 0:
        _await(_say(cell, "beside"), "beside", ("crash", "hang", "error", "patch"))
        time.sleep(6.0)  # longer than hang_beside's timeout and the abort grace
    dist.barrier()
    _record_group(cell)


def slow(cell):
    """Says it is running, takes five seconds, then passes."""
    _say(cell, "slow")
    time.sleep(5.0)
    _record_group(cell)


def genuine(cell):
    """Checks that assert_close is torch's own, then passes."""
    assert torch.testing.assert_close.__module__.startswith("torch"), \
        torch.testing.assert_close
    _record_group(cell)


def die_after_last_cell(cell):
    """Passes, but (once) its process dies with exit code 7 once it has run out of cells:
    a rank's death between cells, which is no cell's fault."""
    once = _out_root(cell) / "died-once"
    if cell.rank == 0 and not once.exists():
        once.write_text("")
        atexit.register(os._exit, 7)
        # Only once ``slow`` runs beside it: its death must not fail that cell either.
        meet = _out_root(cell) / "meet"
        meet.mkdir(exist_ok=True)
        _await(meet, "die_after_last_cell", ("slow",))
    _record_group(cell)
