"""Cells side by side on a world's ranks (``--pack slots``) against one at a time
(``--pack serial``): the same cells, both in one run, as a ratio; and the plan that
``--dry-run`` makes for a multi-GPU host, for several device counts.

    python benchmarks/packing.py [--matrix matrix/parity.yaml] [-k EXPR] [--reps 1]
                                 [--gpus 1 2 4 8] [--smoke]

Part 1 runs ``cpmatrix run --platform cpu --no-cache`` with each packing, alternately
(``--reps`` times each, median wall), and prints the wall times, the ratio, and the sum of
the cells' own durations (from each run's ``report.xml``). On a machine with fewer cores
than ranks the cells of a slot run slower side by side (they share the cores), so the gain
there is the idle ranks' time only; on a many-core host or a GPU node each slot has its
own cores or devices.

Part 2 asks ``--dry-run`` for the cuda platform's plan of the same selection on
``--gpus N`` devices (no GPU needed) and prints each plan's expected makespan,
one-cell-at-a-time time, the most cells at once and the share of device-seconds in use.

``--smoke``: the four single- and two-rank fp64 unit cells, and the plan for 2 GPUs.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from pathlib import Path

from _bench import ROOT, add_smoke, cpmatrix, report

SMOKE = "unit and fp64 and reference and n=5 and (1x1 or 1x2)"
WORLD = re.compile(r"expected makespan ([\d.]+) s \(one cell at a time ([\d.]+) s\), up to "
                   r"(\d+) cells at once, ranks busy (\d+)%")


def run(matrix: str, keyword: str | None, pack: str, out: Path) -> tuple[float, float]:
    """(wall seconds, sum of the cells' own durations) of one run."""
    select = ["-k", keyword] if keyword else []
    wall, _ = cpmatrix("run", "--matrix", matrix, "--platform", "cpu", "--no-cache", "--plain",
                       "--pack", pack, "--out", str(out), *select, cwd=ROOT)
    own = sum(c.time for c in report(out) if c.platform == "cpu"
              and not c.cell_id.startswith("spill_"))
    return wall, own


def gpu_plan(matrix: str, keyword: str | None, gpus: int) -> tuple[str, ...] | None:
    select = ["-k", keyword] if keyword else []
    with tempfile.TemporaryDirectory() as tmp:
        _, proc = cpmatrix("run", "--matrix", matrix, "--platform", "cuda", "--gpus", str(gpus),
                           "--dry-run", "--out", tmp, *select, cwd=ROOT, codes=range(256))
    found = WORLD.search(proc.stdout)
    return found.groups() if found else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--matrix", default=str(ROOT / "matrix" / "parity.yaml"))
    p.add_argument("-k", dest="keyword", default=None)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--gpus", type=int, nargs="*", default=[1, 2, 4, 8])
    add_smoke(p)
    args = p.parse_args()
    if args.smoke:
        args.keyword, args.reps, args.gpus = SMOKE, 1, [2]

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
    if not all(t > 0 for times in own.values() for t in times):
        print("a run's report holds no cpu cell's time: nothing was measured")
        return 1

    print("\ncuda platform, the plan --dry-run makes (expected durations):")
    print("| GPUs | expected makespan | one cell at a time | most cells at once | busy |")
    print("|---|---|---|---|---|")
    for gpus in args.gpus:
        plan = gpu_plan(args.matrix, args.keyword, gpus)
        if plan is None:
            print(f"| {gpus} | (no cuda world) | | | |")
            if args.smoke:  # the smoke plans a selection that has one
                print("the dry run printed no cuda world for the smoke selection")
                return 1
            continue
        makespan, serial_s, most, busy = plan
        print(f"| {gpus} | {makespan} s | {serial_s} s ({float(serial_s) / float(makespan):.2f}x)"
              f" | {most} | {busy}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
