"""Cases behind the showcase report: real parity checks, two mutants, and cells that fail,
crash, hang or crash once on purpose, so one run produces every status."""

import os
import time

import torch
from torch.distributed.tensor import Shard, distribute_module

from cpmatrix.parity import TensorSpec, check_parity
from cpmatrix.parity.mutants import mutants


class LinearGelu(torch.nn.Module):
    def __init__(self, mutant=None):
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)
        self.mutant = mutant

    def forward(self, input):
        y = self.lin(input)
        if self.mutant == "off_by_eps":
            y = y + 1e-3
        if self.mutant == "fp32_roundtrip":
            # Planted: fp64 computed in fp32 (small enough to survive loose tolerances).
            y = y.float().to(input.dtype) if input.dtype == torch.float64 else y * 1.01
        return torch.nn.functional.gelu(y)


@mutants(off_by_eps="the CP output is shifted by 1e-3",
         fp32_roundtrip="the fp64 path computes in fp32")
def linear(cell):
    check_parity(cell, LinearGelu(), LinearGelu(mutant=cell.mutant),
                 inputs={"input": TensorSpec(shape=(12, 16))},
                 placements={"input": [Shard(0), Shard(0)]},
                 prepare_cp=lambda mod, mesh: distribute_module(mod, mesh))


def crash_once(cell):
    """Rank 1 dies on the first attempt only: the retry passes, so the cell is FLAKY."""
    marker = cell.out_dir / "crashed-once"
    if cell.rank == 1 and not marker.exists():
        marker.write_text("1")
        os._exit(3)
    linear(cell)


def broken(cell):
    x = torch.randn(4, generator=cell.generator, dtype=cell.dtype)
    torch.testing.assert_close(x, x + 1e-2 * cell.rank)


def crash(cell):
    if cell.rank == 1:
        os._exit(7)
    linear(cell)


def hang(cell):
    if cell.params.get("wait") == "long":
        time.sleep(60)
    linear(cell)
