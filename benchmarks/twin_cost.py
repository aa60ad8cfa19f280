"""What the fp64 twin costs: the reference suite's 1x1 cells, with the twin and without.

The twin is one more serial run per check, in float64 (docs/parity.md, "The fp64 twin").
This runs the suite's single-rank cases (``*_single`` targets of ``matrix/parity.yaml``,
every fp32/bf16 cell on the reference path, autocast on and off) in one process on a
1-rank gloo group, alternating rounds with the twin and with it switched off (``make_twin``
returning "no twin": the fixed table judges), and prints the time of each and the ratio.
Both variants run the same cases in the same process, after one untimed warm-up round,
alternating which goes first, so machine load hits them alike.

    python benchmarks/twin_cost.py --rounds 3 [--smoke]

``--smoke``: one round of the first case's first cell.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
from _bench import add_smoke

from cpmatrix.cell import TORCH_DTYPES, CellContext, seed_for
from cpmatrix.parity import _twin
from cpmatrix.suite.cases.layer import attention_layer_single
from cpmatrix.suite.cases.module import pair_block_single
from cpmatrix.suite.cases.unit import ring_attention_single
from cpmatrix.suite.cases.workflow import train_step_single

#: (case, dtypes): the suite's 1x1 targets on the reference path (pair_block: fp32 only).
CASES: list[tuple[Callable[[Any], None], tuple[str, ...]]] = [
    (ring_attention_single, ("fp32", "bf16")),
    (attention_layer_single, ("fp32", "bf16")),
    (pair_block_single, ("fp32",)),
    (train_step_single, ("fp32", "bf16")),
]


def _cells(mesh: Any, out: Path) -> list[tuple[Callable[[Any], None], dict[str, Any]]]:
    cells = []
    for case, dtypes in CASES:
        for dtype in dtypes:
            for autocast in (False, True):
                if dtype == "fp32" and autocast:
                    continue  # the suite's autocast cells are bf16
                if case is train_step_single and dtype == "bf16" and not autocast:
                    continue  # excluded in matrix/parity.yaml (no bf16 master weights)
                cells.append((case, {"dtype": dtype, "autocast": autocast}))
    return cells


def _context(case: Callable[[Any], None], dtype: str, autocast: bool, mesh: Any,
             out: Path) -> CellContext:
    cell_id = f"{case.__name__}[bench,1x1,{dtype},autocast={'on' if autocast else 'off'}]"
    seed = seed_for(cell_id)
    torch.manual_seed(seed)
    return CellContext(
        id=cell_id, rank=0, world_size=1, mesh=mesh, device=torch.device("cpu"),
        backend="gloo", dtype=getattr(torch, TORCH_DTYPES[dtype]), dtype_name=dtype,
        autocast=autocast, path="reference", level="unit", params={"n": 7}, seed=seed,
        generator=torch.Generator().manual_seed(seed), out_dir=out)


@contextmanager
def _no_twin() -> Any:
    # Every parity module that imported make_twin gets the switched-off one, wherever the
    # checks live now (a hard-coded list went stale when a module split).
    users = [m for name, m in list(sys.modules.items())
             if name.startswith("cpmatrix.parity") and getattr(m, "make_twin", None)
             is _twin.make_twin]
    assert _twin in users and len(users) > 1, "no parity module calls make_twin any more"
    with ExitStack() as stack:
        for module in users:
            stack.enter_context(mock.patch.object(module, "make_twin",
                                                  lambda serial: _twin.Twin(why="off")))
        yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    add_smoke(parser)
    args = parser.parse_args()
    if args.smoke:
        args.rounds = 1
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29571")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("cp0", "cp1"))
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            cells = _cells(mesh, out)[:1] if args.smoke else _cells(mesh, out)
            for case, kw in cells:  # warm-up (imports, first-call costs), not timed
                case(_context(case, kw["dtype"], kw["autocast"], mesh, out))
            totals = {"with twin": 0.0, "without": 0.0}
            for round_ in range(args.rounds):
                order = list(totals) if round_ % 2 == 0 else list(totals)[::-1]
                for variant in order:
                    t0 = time.perf_counter()
                    with _no_twin() if variant == "without" else _nullcontext():
                        for case, kw in cells:
                            case(_context(case, kw["dtype"], kw["autocast"], mesh, out))
                    totals[variant] += time.perf_counter() - t0
    finally:
        dist.destroy_process_group()
    n = len(cells) * args.rounds
    print(f"{len(cells)} single-rank fp32/bf16 reference cells x {args.rounds} rounds")
    for variant, total in totals.items():
        print(f"  {variant:10} {total:7.2f} s  ({1000 * total / n:6.1f} ms a cell)")
    print(f"  the twin adds {100 * (totals['with twin'] / totals['without'] - 1):.0f}% "
          f"({totals['with twin'] / totals['without']:.2f}x) to these cells' own time")


@contextmanager
def _nullcontext() -> Any:
    yield


if __name__ == "__main__":
    main()
