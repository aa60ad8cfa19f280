"""Batched vs one-torchrun-per-cell: wall times, their ratio, and the per-cell overhead.

    python benchmarks/batching.py [--reps N] [--skip-unbatched] [--smoke]

Runs the same selection twice through the real CLI: batched (default: one world per
mesh size) and ``--batch-size 1``. The batched run uses ``--pack serial`` (one cell at a
time). From its report (``report.xml``: each cell's duration in its world, slowest rank,
and its case's own time) it prints two overheads per mesh size:

- **in the cell**: duration minus case time, median over the cells: what cpmatrix does
  inside a cell around its case (reseed, the cell's mesh, the case's import, evidence);
- **per cell, all in**: the batched run's wall time minus the cases' own time, over the
  cells: everything else (world starts, per-cell isolation, group checks, the outcome
  barrier, the CLI itself) spread over the cells; an upper bound on a warm cell's cost.

Neither is the start-to-start gap between two warm cells that this script printed before
issue 23 (read from a world's internal progress files, which cells sharing a world's ranks
no longer write alike); ``cpmatrix run --profile`` (docs/figures.md) breaks the between-cells
part down. ``--smoke``: one cell per mesh.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from _bench import add_batching_reps, add_smoke, report, run_batching


def overheads(out: Path, wall: float) -> tuple[dict[int, list[float]], float]:
    """In-cell overheads (s) per world size, and the run's all-in overhead per cell (s)."""
    inside: dict[int, list[float]] = {}
    cells = report(out)
    for cell in cells:
        size = int(cell.properties["world_size"])
        case = float(cell.properties["case_time"])
        inside.setdefault(size, []).append(cell.time - case)
    all_in = (wall - sum(float(c.properties["case_time"]) for c in cells)) / len(cells)
    return inside, all_in


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_batching_reps(ap)
    ap.add_argument("--skip-unbatched", action="store_true")
    add_smoke(ap)
    args = ap.parse_args()
    reps = 1 if args.smoke else args.reps
    select = " or ".join(f"rep={i}]" for i in range(reps))
    cells = 2 * reps
    with tempfile.TemporaryDirectory() as tmp:
        batched = run_batching(Path(tmp, "batched"), select, cells, "--pack", "serial")
        inside, all_in = overheads(Path(tmp, "batched"), batched)
        print(f"cells: {cells} ({reps} on 2x2, {reps} on 3x3), gloo on CPU")
        print(f"batched (one world, serial):    {batched:7.1f} s")
        for size, values in sorted(inside.items()):
            print(f"in-cell overhead, {size} ranks: median {1000 * statistics.median(values):.1f}"
                  f" ms over {len(values)} cells")
        print(f"per cell, all in (wall - cases' own time) / cells: {1000 * all_in:.0f} ms")
        if not args.skip_unbatched:
            single = run_batching(Path(tmp, "single"), select, cells, "--batch-size", "1")
            print(f"one torchrun per cell:          {single:7.1f} s")
            print(f"ratio: batched is {single / batched:.1f}x faster")


if __name__ == "__main__":
    main()
