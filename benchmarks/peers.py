"""cpmatrix side by side with its peers on the same cells, in one run, as ratios.

    python benchmarks/peers.py [--reps 15] [--per-cell] [--skip-torchrun] [--smoke]

The cells: ``benchmarks/batching.yaml`` (a small fp64 DTensor matmul + layer_norm parity
check, forward and backward), ``--reps`` times on a 2x2 mesh and ``--reps`` times on 3x3
(``--smoke``: once, on 2x2 only, without torchrun). Contestants, each timed wall-clock
from the command's start to its exit:

- cpmatrix, batched, fork launcher (the default);
- cpmatrix, batched, ``--launcher torchrun`` (each rank a fresh interpreter);
- PyTorch's ``MultiProcContinuousTest`` (``benchmarks/_peers_continuous.py``; one forked
  world per test class, tests sent over a queue; needs expecttest, in the ``dev`` and
  ``bench`` extras);
- with ``--per-cell``: cpmatrix ``--batch-size 1`` (one world per cell, fork launcher).

Machines are noisy: compare the ratios, which are measured in one run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench import HERE, add_batching_reps, add_smoke, run_batching


def timed(argv: list[str], env: dict[str, str], tests: int) -> float:
    """Wall seconds of the peer, which must have run ``tests`` tests: unittest exits 0
    after running none, and a peer that did less work would look faster."""
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    wall = time.monotonic() - t0
    ran = re.search(r"^Ran (\d+) tests? in ", proc.stderr, re.MULTILINE)
    if proc.returncode != 0 or ran is None or int(ran.group(1)) != tests:
        sys.exit(f"{argv[:4]} failed ({proc.returncode}; {tests} tests expected):\n"
                 f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_batching_reps(ap)
    ap.add_argument("--per-cell", action="store_true", help="also one world per cell (slow)")
    ap.add_argument("--skip-torchrun", action="store_true")
    add_smoke(ap)
    args = ap.parse_args()
    reps = 1 if args.smoke else args.reps
    meshes = ("2x2",) if args.smoke else ("2x2", "3x3")
    select = f"({' or '.join(f'rep={i}]' for i in range(reps))})"
    if args.smoke:
        select += " and 2x2"
    cells = len(meshes) * reps
    walls: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        walls["cpmatrix (fork launcher)"] = run_batching(Path(tmp, "fork"), select, cells)
        env = dict(os.environ, CPMATRIX_PEER_REPS=str(reps), OMP_NUM_THREADS="1",
                   CPMATRIX_PEER_MESHES=",".join(m[0] for m in meshes))
        # torch's run_tests reads ``CI`` (set on CI machines): it then writes XML reports
        # through xmlrunner and changes which tests run. The peer is timed as a developer
        # runs it, the same on every machine.
        env.pop("CI", None)
        walls["MultiProcContinuousTest"] = timed(
            [sys.executable, str(HERE / "_peers_continuous.py")], env=env,
            tests=cells)
        if not (args.skip_torchrun or args.smoke):
            walls["cpmatrix (--launcher torchrun)"] = run_batching(
                Path(tmp, "torchrun"), select, cells, "--launcher", "torchrun")
        if args.per_cell:
            walls["cpmatrix, one world per cell"] = run_batching(
                Path(tmp, "single"), select, cells, "--batch-size", "1")
    base = walls["cpmatrix (fork launcher)"]
    print(f"{cells} cells ({reps} on each of {', '.join(meshes)}), gloo on CPU")
    for name, wall in walls.items():
        print(f"{name:34}{wall:8.1f} s  {wall / base:5.2f}x cpmatrix's time")


if __name__ == "__main__":
    main()
