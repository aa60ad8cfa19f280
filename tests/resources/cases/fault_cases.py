"""Cases that misbehave on purpose: the runtime's fault tests drive these.

Each takes ``cell.params["fault"]`` and, when it is not ``none``, misbehaves in that
way; ``none`` does a real collective round trip and records evidence.
"""

import os
import signal
import time

import torch
import torch.distributed as dist


def _roundtrip(cell):
    x = torch.randn(8, generator=cell.generator, dtype=cell.dtype)
    y = x.clone()
    group = cell.mesh.get_group("cp1")
    dist.all_reduce(y, group=group)
    torch.testing.assert_close(y, x * cell.mesh.size(1))
    cell.record("max_abs_err", float((y - x * cell.mesh.size(1)).abs().max()))
    return group


#: Positions in a batch where ``faulty`` misbehaves: first, middle, last of 7.
FAULT_POSITIONS = (0, 3, 6)


def faulty(cell):
    fault = cell.params.get("fault", "none")
    group = _roundtrip(cell)
    if fault == "none" or cell.params.get("pos", 0) not in FAULT_POSITIONS:
        return
    if fault == "raise_all":
        raise RuntimeError(f"planted failure on rank {cell.rank}")
    if fault == "raise_rank1":
        if cell.rank == 1:
            raise ValueError("planted failure on rank 1 only")
        # The other ranks wait in a collective rank 1 never joins.
        z = torch.ones(2)
        dist.all_reduce(z, group=group)
        return
    if fault == "exit13":
        if cell.rank == 1:
            os._exit(13)
        dist.all_reduce(torch.ones(2), group=group)
        return
    if fault == "sigkill":
        if cell.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(torch.ones(2), group=group)
        return
    if fault == "hang_collective":
        if cell.rank != 1:  # rank 1 skips it; the others wait forever
            dist.all_reduce(torch.ones(2), group=group)
        return
    if fault == "spin":
        while True:
            time.sleep(0.001)
    if fault == "nan":
        v = torch.tensor([float("nan")])
        assert not torch.isnan(v).any(), "output has NaN"
        return
    raise AssertionError(f"unknown fault {fault!r}")
