"""Tiny cases used by the test-suite's fixture matrices."""

import torch
import torch.distributed as dist


def ok(cell):
    return None


def allreduce(cell):
    x = torch.randn(4, generator=cell.generator, dtype=cell.dtype)
    y = x.clone()
    dist.all_reduce(y, group=cell.mesh.get_group("cp1"))
    torch.testing.assert_close(y, x * cell.mesh.size(1))
    cell.record("max_abs_err", float((y - x * cell.mesh.size(1)).abs().max()))


def evidence(cell):
    """Records what the worker set up, so tests can check the case contract."""
    import os

    cell.record("rank_seed", cell.seed)
    cell.record("world_size", cell.world_size)
    cell.record("mesh_shape", "x".join(str(s) for s in cell.mesh.shape))
    cell.record("dim_names", ",".join(cell.mesh.mesh_dim_names))
    cell.record("draw", float(torch.randn(1, generator=cell.generator)))
    cell.record("tz", os.environ.get("TZ", ""))
    cell.record("secret_visible", "CPMATRIX_TEST_SECRET" in os.environ)
    run_root = str(cell.out_dir).split("/cells/")[0]
    cell.record("home_private", os.environ["HOME"].startswith(run_root))
    cell.record("rank", cell.rank)  # differs per rank: reported as rank@rankN
    os.environ["LEAK_FROM_CASE"] = "1"  # the worker must restore the environment
    (cell.out_dir / "note.txt").write_text("written by the case")


def interfaces(cell):
    """Records the network interfaces this rank can see (hermetic runners: only lo)."""
    import socket

    cell.record("interfaces", ",".join(sorted(name for _, name in socket.if_nameindex())))
    x = torch.randn(16, generator=cell.generator, dtype=torch.float64)
    y = x.clone()
    dist.all_reduce(y, group=cell.mesh.get_group("cp1"))
    cell.record("checksum", float((y * torch.arange(16, dtype=torch.float64)).sum()))


def sleepy(cell):
    """Finishes a little after its timeout: while the supervisor dumps the stacks."""
    import time

    time.sleep(float(cell.params["secs"]))
    cell.record("slept", float(cell.params["secs"]))
