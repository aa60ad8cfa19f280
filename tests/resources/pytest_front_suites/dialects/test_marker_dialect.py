"""Plain pytest tests that ask for ranks with @pytest.mark.world (the clean form).

Natively they run under `torchrun --nproc-per-node 2 -m pytest` (each rank a pytest
process); with --cpmatrix, in a world. The outcomes must be the same.
"""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import Shard, distribute_tensor

SHARED = []


@pytest.fixture(scope="module")
def module_value():
    # Module-scoped and group-free: lives as long as pytest keeps it, in each rank.
    return torch.arange(4.0)


@pytest.mark.world(2)
def test_allreduce(rank, world_size):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    assert world_size == 2
    assert t.item() == 3.0


@pytest.mark.world(2)
@pytest.mark.parametrize("n", [2, 6])
def test_sharded_sum(mesh, n, module_value):
    x = torch.ones(n, 3)
    dx = distribute_tensor(x, mesh, [Shard(0)])
    assert dx.full_tensor().sum().item() == 3.0 * n
    assert module_value.sum().item() == 6.0


@pytest.mark.world(2)
def test_cell_fixture(cell, rank):
    assert cell.rank == rank == dist.get_rank()
    assert cell.world_size == 2
    # The user's view only: the target's axes (none natively), no cpmatrix internals.
    assert set(cell.params) <= {"test"}, cell.params
    assert cell.platform == cell.device.type and cell.dtype_name == "fp64"
    draws = torch.randn(3, generator=cell.generator)
    gathered = [torch.zeros(3) for _ in range(2)]
    dist.all_gather(gathered, draws)
    # The generator is seeded from the test: the same draws on every rank.
    torch.testing.assert_close(gathered[0], gathered[1])


@pytest.mark.world(2)
def test_fails_on_rank_zero(rank):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    assert rank != 0, "planted failure on rank 0"


@pytest.mark.world(2)
@pytest.mark.xfail(reason="known: gather order", strict=True)
def test_expected_failure(rank):
    out = [torch.zeros(1) for _ in range(2)]
    dist.all_gather(out, torch.tensor([float(rank)]))
    assert out[0].item() == 1.0


@pytest.mark.world(2)
@pytest.mark.xfail(reason="was flaky once")
def test_unexpected_pass(rank):
    dist.barrier()


@pytest.mark.world(2)
@pytest.mark.skip(reason="not on this backend")
def test_skipped_by_marker(rank):
    raise AssertionError("never runs")


@pytest.mark.world(2)
def test_skipped_inside(rank):
    dist.barrier()
    pytest.skip("decided inside the test, on every rank")


@pytest.mark.world(2)
def test_record_properties(rank, record_property):
    record_property("rank_seen", rank)
    dist.barrier()


def test_local_no_ranks():
    # No marker: runs in the controller as usual (and natively in each torchrun rank).
    SHARED.append(1)
    assert torch.ones(2).sum().item() == 2.0
