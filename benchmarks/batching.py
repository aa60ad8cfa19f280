"""Batched vs one-torchrun-per-cell: wall times, their ratio, and warm-cell overhead.

    python benchmarks/batching.py [--reps N] [--skip-unbatched]

Runs the same selection twice through the real CLI: batched (default: one world per
mesh size) and ``--batch-size 1``. The batched run uses ``--pack serial`` (one cell at a
time), so that a warm cell's overhead is measurable: the time between two consecutive
cells' start markers in a world minus the first one's case time (its slowest rank's):
everything cpmatrix does between two cases (environment, reseed, process-state snapshot,
restore and checks, group hygiene, outcome write, store barrier, next start marker), over
all cells but each world's first and each size's last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent


def run(out: Path, select: str, *extra: str) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "cpmatrix", "run", "--matrix", str(HERE / "batching.yaml"),
         "-k", select, "--out", str(out), "--plain", "--no-cache", *extra],
        capture_output=True, text=True, check=False,
    )
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall


def warm_overheads(out: Path) -> dict[int, list[float]]:
    """Warm-cell overheads (s) per cell size (cells of one size run back to back)."""
    overheads: dict[int, list[float]] = {}
    for world in sorted((out / "worlds").glob("*.a*")):
        progress = world / "progress"
        spec = json.loads((world / "world.json").read_text())
        sizes = [c["rows"] * c["cols"] for c in spec["cells"]]
        starts = [json.loads((progress / f"{i}.r0.start").read_text())["time"]
                  for i in range(len(sizes))]
        # The case's own time is its slowest rank's: the others wait for it at the barrier.
        case = [max(json.loads((progress / f"{i}.r{r}.done").read_text())["case_s"]
                    for r in range(size)) for i, size in enumerate(sizes)]
        for i in range(1, len(sizes) - 1):
            if sizes[i - 1] == sizes[i] == sizes[i + 1]:  # warm, and not a group switch
                overheads.setdefault(sizes[i], []).append(starts[i + 1] - starts[i] - case[i])
    return overheads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15, help="cells per mesh (2x2 and 3x3)")
    ap.add_argument("--skip-unbatched", action="store_true")
    args = ap.parse_args()
    select = " or ".join(f"rep={i}]" for i in range(args.reps))
    cells = 2 * args.reps
    with tempfile.TemporaryDirectory() as tmp:
        batched = run(Path(tmp, "batched"), select, "--pack", "serial")
        over = warm_overheads(Path(tmp, "batched"))
        print(f"cells: {cells} ({args.reps} on 2x2, {args.reps} on 3x3), gloo on CPU")
        print(f"batched (one world, serial):    {batched:7.1f} s")
        for size, values in sorted(over.items()):
            print(f"warm cell overhead, {size} ranks: median {1000 * statistics.median(values):.1f}"
                  f" ms, max {1000 * max(values):.1f} ms over {len(values)} warm cells")
        if not args.skip_unbatched:
            single = run(Path(tmp, "single"), select, "--batch-size", "1")
            print(f"one torchrun per cell:          {single:7.1f} s")
            print(f"ratio: batched is {single / batched:.1f}x faster")


if __name__ == "__main__":
    main()
