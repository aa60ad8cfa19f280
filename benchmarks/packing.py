"""Cells side by side on a world's ranks (``--pack slots``) against one at a time
(``--pack serial``): the same cells, both in one run, as a ratio; and the plan that
``--dry-run`` makes for a multi-GPU host, for several device counts.

    python benchmarks/packing.py [--matrix matrix/parity.yaml] [-k EXPR] [--reps 1]
                                 [--gpus 1 2 4 8]

Part 1 runs ``cpmatrix run --platform cpu --no-cache`` with each packing, alternately
(``--reps`` times each, median wall), and prints the wall times, the ratio, and the sum of
the cells' own durations. On a machine with fewer cores than ranks the cells of a slot run
slower side by side (they share the cores), so the gain there is the idle ranks' time
only; on a many-core host or a GPU node each slot has its own cores or devices.

Part 2 asks ``--dry-run`` for the cuda platform's plan on ``--gpus N`` devices (no GPU
needed) and prints each plan's expected makespan, one-cell-at-a-time time, the most cells
at once and the share of device-seconds in use.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).parents[1]
WORLD = re.compile(r"expected makespan ([\d.]+) s \(one cell at a time ([\d.]+) s\), up to "
                   r"(\d+) cells at once, ranks busy (\d+)%")


def run(matrix: str, keyword: str | None, pack: str, out: Path) -> tuple[float, float]:
    """(wall seconds, sum of the cells' own durations) of one run."""
    cmd = [sys.executable, "-m", "cpmatrix", "run", "--matrix", matrix, "--platform", "cpu",
           "--no-cache", "--plain", "--pack", pack, "--out", str(out)]
    if keyword:
        cmd += ["-k", keyword]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{pack}: exit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    results = json.loads((out / "results.json").read_text())
    own = sum(r["duration_s"] for r in results if r["cell_id"].endswith("@cpu")
              and not r["cell_id"].startswith("spill_"))
    return wall, own


def gpu_plan(matrix: str, gpus: int) -> tuple[str, ...] | None:
    proc = subprocess.run(
        [sys.executable, "-m", "cpmatrix", "run", "--matrix", matrix, "--platform", "cuda",
         "--gpus", str(gpus), "--dry-run", "--out", tempfile.mkdtemp()],
        cwd=ROOT, capture_output=True, text=True, check=False)
    found = WORLD.search(proc.stdout)
    return found.groups() if found else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--matrix", default=str(ROOT / "matrix" / "parity.yaml"))
    p.add_argument("-k", dest="keyword", default=None)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--gpus", type=int, nargs="*", default=[1, 2, 4, 8])
    args = p.parse_args()

    walls: dict[str, list[float]] = {"slots": [], "serial": []}
    own: dict[str, list[float]] = {"slots": [], "serial": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for pack in ("slots", "serial"):
                wall, cells = run(args.matrix, args.keyword, pack, Path(tmp) / f"{pack}{rep}")
                walls[pack].append(wall)
                own[pack].append(cells)
                print(f"  {pack:6} rep {rep + 1}: {wall:6.1f} s wall, cells' own {cells:6.1f} s",
                      flush=True)
    slots, serial = statistics.median(walls["slots"]), statistics.median(walls["serial"])
    print(f"\ncpu platform ({args.matrix}{' -k ' + args.keyword if args.keyword else ''}):")
    print("| packing | wall | cells' own time (sum) |")
    print("|---|---|---|")
    for pack in ("slots", "serial"):
        print(f"| {pack} | {statistics.median(walls[pack]):.1f} s | "
              f"{statistics.median(own[pack]):.1f} s |")
    print(f"serial / slots = {serial / slots:.2f}x")

    print("\ncuda platform, the plan --dry-run makes (expected durations):")
    print("| GPUs | expected makespan | one cell at a time | most cells at once | busy |")
    print("|---|---|---|---|---|")
    for gpus in args.gpus:
        plan = gpu_plan(args.matrix, gpus)
        if plan is None:
            print(f"| {gpus} | (no cuda world) | | | |")
            continue
        makespan, serial_s, most, busy = plan
        print(f"| {gpus} | {makespan} s | {serial_s} s ({float(serial_s) / float(makespan):.2f}x)"
              f" | {most} | {busy}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
