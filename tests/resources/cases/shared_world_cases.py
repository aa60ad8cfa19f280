"""Cases for tests/resources/shared_world.yaml: cells of several sizes in one world."""

import os

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
