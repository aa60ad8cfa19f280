"""The trivial case of ``world.yaml``: one all-reduce, so a world's start is all it costs."""

import torch
import torch.distributed as dist


def one_allreduce(cell):
    x = torch.ones(1, device=cell.device)
    dist.all_reduce(x)  # nccl builds its communicator here, on the first collective
    assert x.item() == cell.world_size, x
    cell.record("device", str(x.device))
    cell.record("backend", cell.backend)
