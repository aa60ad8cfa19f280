"""Time load + expand of a generated matrix of at least 10,000 cells.

Usage::

    python benchmarks/expand.py [--targets 10] [--seq 20] [--repeat 3] [--smoke]

Writes the matrix and a one-function case module to a temporary directory, then
prints the cell count, the seconds taken and the cells per second for load+expand
and for expand alone (best of ``--repeat`` runs, plus the first, cold run). The
issue's budget is under 1 s on a 2-core machine; the script exits 1 when the
best load+expand run is over ``--budget`` seconds. ``--smoke`` times one small matrix
once and checks neither the cell count nor the budget.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from _bench import add_smoke

from cpmatrix.matrix.expand import expand
from cpmatrix.matrix.load import load_matrix

MESHES = ("1x1", "1x2", "2x2", "2x3", "3x3")


def write_matrix(directory: Path, targets: int, seq: int) -> Path:
    """A matrix of ``targets`` targets, each over every axis value and ``seq`` seq values.

    Per target: 5 meshes x 11 valid (dtype, autocast, path) combinations x ``seq``,
    with one exclude and one include per target so both code paths are timed.
    """
    (directory / "cases").mkdir()
    (directory / "cases" / "bench_cases.py").write_text("def ok(cell):\n    return None\n")
    seqs = ", ".join(str(8 * (i + 1)) for i in range(seq))
    lines = [
        "version: 1",
        "pythonpath: [cases]",
        "defaults:",
        f"  mesh: [{', '.join(MESHES)}]",
        "  dtype: [fp64, fp32, bf16, fp16]",
        "  autocast: [off, on]",
        "  path: [reference, kernel]",
        "platforms:",
        "  cpu: {backend: gloo, device: cpu}",
        "targets:",
    ]
    for t in range(targets):
        lines.append(
            f"  - {{name: op{t}, case: 'bench_cases:ok', level: unit, tags: [bench],"
            f" timeout: short, params: {{seq: [{seqs}]}}}}"
        )
    lines.append("exclude:")
    for t in range(targets):
        lines.append(f"  - {{target: op{t}, mesh: 3x3, dtype: fp16, seq: 8}}")
    lines.append("include:")
    for t in range(targets):
        lines.append(f"  - {{target: op{t}, mesh: 3x3, dtype: fp16, path: kernel, seq: 8}}")
    path = directory / "bench.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--targets", type=int, default=10)
    ap.add_argument("--seq", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--budget", type=float, default=1.0, help="seconds for load+expand")
    add_smoke(ap)
    args = ap.parse_args(argv)
    if args.smoke:
        args.targets, args.seq, args.repeat = 1, 2, 1

    with tempfile.TemporaryDirectory(prefix="cpmatrix-bench-") as tmp:
        path = write_matrix(Path(tmp), args.targets, args.seq)
        both: list[float] = []
        alone: list[float] = []
        cells = 0
        for _ in range(max(1, args.repeat)):
            t0 = time.perf_counter()
            matrix = load_matrix(path)
            t1 = time.perf_counter()
            expansion = expand(matrix)
            t2 = time.perf_counter()
            cells = len(expansion.cells)
            both.append(t2 - t0)
            alone.append(t2 - t1)

    def line(label: str, seconds: list[float]) -> str:
        best = min(seconds)
        return (
            f"{label:<13} {cells} cells  best {best:.3f} s  ({cells / best:,.0f} cells/s)"
            f"  first {seconds[0]:.3f} s"
        )

    print(f"matrix: {args.targets} targets, {cells} cells after exclude/include/constraints")
    print(line("load+expand", both))
    print(line("expand alone", alone))
    if cells == 0:
        print("the matrix expanded to no cell: nothing was measured", file=sys.stderr)
        return 1
    if args.smoke:
        return 0
    if cells < 10_000:
        print(f"too few cells ({cells} < 10000): raise --targets or --seq", file=sys.stderr)
        return 1
    if min(both) > args.budget:
        print(f"over budget: {min(both):.3f} s > {args.budget} s", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
