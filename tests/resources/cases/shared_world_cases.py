"""Cases for tests/resources/shared_world.yaml: cells of several sizes in one world."""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist


def sizes(cell):
    """The cell's group is exactly its mesh; a derived (flattened) mesh works on it."""
    cell.record("dist_world_size", dist.get_world_size())
    cell.record("env_world_size", int(os.environ["WORLD_SIZE"]))
    assert dist.get_world_size() == cell.world_size == cell.mesh.size()
    flat = cell.mesh._flatten("flat")  # a new group of only this cell's ranks
    t = torch.ones(1, dtype=torch.float64)
    dist.all_reduce(t, group=flat.get_group())
    cell.record("flat_sum", float(t.item()))
    assert t.item() == cell.world_size


def crash_rank1(cell):
    """Rank 1 of a 1x2 cell (in a larger world) dies mid-cell."""
    t = torch.ones(1)
    dist.all_reduce(t)
    if cell.rank == 1:
        os._exit(13)
    dist.all_reduce(t)


def kill_idle_rank(cell):
    """Rank 0 of a 1x1 cell kills the world's last rank (sitting this cell out), once.

    The world's folder is the launcher's working directory; its ``rank<N>.pid`` files
    name the ranks."""
    once = Path(cell.out_dir).parent / "killed-once"
    if once.exists():
        return
    once.write_text("")
    world = Path(os.getcwd())
    last = max(int(p.name[4:-4]) for p in world.glob("rank*.pid"))
    pid = json.loads((world / f"rank{last}.pid").read_text())["pid"]
    cell.record("killed_rank", last)
    os.kill(pid, 9)
    dist.barrier()  # the world goes down around this rank; it must not blame the cell
    import time
    time.sleep(60)
