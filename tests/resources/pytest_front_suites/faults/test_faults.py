"""Planted faults beside healthy tests, all sharing worlds under --cpmatrix.

Each fault must fail only its own test, naming the rank, and every other test must pass
(after a fault, the tests that shared the world rerun in a fresh one).
"""

import os
import signal

import pytest
import torch
import torch.distributed as dist

#: The tests this rank's process has run (the module lives as long as the rank's session).
RAN = []


@pytest.mark.world(2)
@pytest.mark.parametrize("k", range(3))
def test_neighbour(rank, k):
    RAN.append(f"neighbour{k}")
    t = torch.tensor([float(rank + k)])
    dist.all_reduce(t)
    assert t.item() == 1.0 + 2 * k


@pytest.mark.world(2)
@pytest.mark.timeout(6)
def test_planted_hang(rank):
    if rank == 1:
        dist.all_reduce(torch.ones(1))  # rank 0 never joins: a hang in a collective


@pytest.mark.world(2)
def test_planted_crash(rank):
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


@pytest.mark.world(2)
def test_planted_leak(rank):
    # Replaces a torch function and leaves it: every later test's assert_close would pass.
    torch.testing.assert_close = lambda *args, **kwargs: None
    dist.barrier()


@pytest.mark.world(2)
def test_assert_close_is_real(rank):
    dist.barrier()
    with pytest.raises(AssertionError):
        torch.testing.assert_close(torch.zeros(2), torch.ones(2))


@pytest.mark.world(2)
@pytest.mark.isolated_world
@pytest.mark.parametrize("k", range(2))
def test_isolated(rank, k):
    # Its world is its own: the world's name says so, and no other test ran in its
    # processes before it (not a neighbour, not the other isolated test).
    assert "isolated" in os.environ["CPMATRIX_WORLD"]
    assert RAN == [], RAN
    RAN.append(f"isolated{k}")
    dist.barrier()
