"""The peer side of benchmarks/peers.py: PyTorch's ``MultiProcContinuousTest`` running the
same checks as ``benchmarks/batching.yaml`` (bench_cases.matmul_layernorm, fp64, gloo),
``REPS`` tests on a 2x2 mesh (a 4-rank world) and ``REPS`` on 3x3 (a 9-rank world);
``CPMATRIX_PEER_MESHES=2`` keeps the 2x2 mesh only (peers.py's ``--smoke``).

    CPMATRIX_PEER_REPS=15 python benchmarks/_peers_continuous.py

Needs expecttest (torch.testing._internal imports it; in the ``dev`` and ``bench`` extras).
With ``CI`` set, torch's ``run_tests`` writes XML through xmlrunner, which is not
installed here: ``peers.py`` runs this script without ``CI``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.common_distributed import MultiProcContinuousTest
from torch.testing._internal.common_utils import run_tests

sys.path.insert(0, str(Path(__file__).parent / "cases"))
from bench_cases import matmul_layernorm

REPS = int(os.environ.get("CPMATRIX_PEER_REPS", "15"))
MESHES = {int(rows) for rows in os.environ.get("CPMATRIX_PEER_MESHES", "2,3").split(",")}


def _check(test: MultiProcContinuousTest, rows: int, rep: int) -> None:
    mesh = init_device_mesh("cpu", (rows, rows))
    generator = torch.Generator().manual_seed(rep)
    cell = SimpleNamespace(generator=generator, dtype=torch.float64, mesh=mesh,
                           record=lambda *_: None)
    matmul_layernorm(cell)


class _Base(MultiProcContinuousTest):
    @classmethod
    def backend_str(cls) -> str:
        return "gloo"

    @classmethod
    def device_type(cls) -> str:
        return "cpu"


class Mesh2x2(_Base):
    world_size = 4


class Mesh3x3(_Base):
    world_size = 9


def _add_tests() -> None:
    # In a function: a loop variable left at module level holding a class (``_cls``) is
    # one more TestCase to unittest's loader, which then ran the 3x3 class twice.
    for rows, cls in ((2, Mesh2x2), (3, Mesh3x3)):
        # A class left without tests never starts its world (setUpClass runs before one).
        for rep in range(REPS if rows in MESHES else 0):
            setattr(cls, f"test_rep{rep:02d}",
                    lambda self, r=rep, n=rows: _check(self, n, r))


_add_tests()


if __name__ == "__main__":
    run_tests()
