"""What ``cpmatrix init`` writes: starter cases, matrix, gates and the pyproject table.

They run green at once on a CPU machine (``tests/e2e/test_newcomer.py`` runs them):
4 cells of a collective on 1x2 and 2x2 meshes, a tensor-parallel MLP checked by the
parity toolkit with a planted bug (``--mutants``), and a release policy over both.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CASES", "GATES", "MATRIX", "table"]

#: ``cases.py``.
CASES: Final = '''\
"""Your cases: each function runs on every rank of its cell's mesh and fails by raising.

Written by `cpmatrix init`; change them into your own (docs: README.md, docs/running.md).
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import Partial
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from cpmatrix.parity import TensorSpec, check_parity, mutant_on, mutants


def allreduce_sum(cell):
    """A collective against its serial result: the sum of the cp1 ranks' shards."""
    full = torch.randn(cell.world_size, 8, generator=cell.generator, dtype=cell.dtype)
    mine = full[cell.rank].clone()  # this rank's shard
    dist.all_reduce(mine, group=cell.mesh.get_group("cp1"))
    cols = cell.mesh.size(1)
    row = cell.rank // cols  # the ranks of my cp1 group
    serial = full[row * cols:(row + 1) * cols].sum(0)
    cell.record("max_abs_err", float((mine - serial).abs().max()))
    torch.testing.assert_close(mine, serial)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def parallelize(module, mesh, cell):
    """Tensor parallel over cp1; the planted bug leaves the partial sums unreduced."""
    bug = mutant_on(cell, "no_allreduce")
    down = RowwiseParallel(output_layouts=Partial()) if bug else RowwiseParallel()
    return parallelize_module(module, mesh["cp1"], {"up": ColwiseParallel(), "down": down})


@mutants(no_allreduce="the row-parallel output is not all-reduced")
def tp_mlp(cell):
    """A module and its parallelization against the same module run serially."""
    torch.manual_seed(cell.seed)  # the same weights on every rank
    check_parity(cell, MLP(), MLP(), inputs={"x": TensorSpec(shape=(4, 8))},
                 placements={"x": None}, prepare_cp=lambda m, mesh: parallelize(m, mesh, cell))
'''

#: ``matrix.yaml``.
MATRIX: Final = """\
# Written by `cpmatrix init`: which cells to run (docs/matrix.md). `cpmatrix list` shows them.
version: 1
pythonpath: ["."]                      # folders searched for case modules, from this file
platforms:
  cpu: {backend: gloo, device: cpu}
targets:
  - name: allreduce_sum
    case: cases:allreduce_sum
    level: unit
    tags: [release]
    axes: {mesh: [1x2, 2x2], dtype: [fp64, fp32]}
  - name: tp_mlp
    case: cases:tp_mlp
    level: layer
    tags: [release]
    axes: {mesh: [1x2], dtype: [fp64]}
"""

#: ``gates.yaml``.
GATES: Final = """\
# Written by `cpmatrix init`: what must hold before a release (docs/gate.md).
# `cpmatrix gate --policy release` decides from the last run's report.
version: 1
policies:
  release:
    description: every cell of matrix.yaml passed, from the sources it has now
    tags: [release]
    matrix: [matrix.yaml]
"""


def table(folder: str) -> str:
    """The ``[tool.cpmatrix]`` table for starter files in ``folder`` (relative to the
    pyproject.toml).

    >>> print(table("tests/cp"))  # doctest: +NORMALIZE_WHITESPACE
    [tool.cpmatrix]
    # cpmatrix's settings: keys are its flags without '--' (`cpmatrix config` lists them).
    matrix = "tests/cp/matrix.yaml"
    gates = "tests/cp/gates.yaml"
    out = "out"
    policy = "release"
    <BLANKLINE>
    """
    return (
        "[tool.cpmatrix]\n"
        "# cpmatrix's settings: keys are its flags without '--' (`cpmatrix config` lists "
        "them).\n"
        f'matrix = "{folder}/matrix.yaml"\n'
        f'gates = "{folder}/gates.yaml"\n'
        'out = "out"\n'
        'policy = "release"\n'
    )
