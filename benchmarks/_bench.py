"""What the benchmarks share; not a benchmark itself (a name starting with ``_`` is a
helper: ``tests/e2e/test_benchmarks.py`` runs every other ``benchmarks/*.py`` with
``--smoke``).

A benchmark drives cpmatrix as a user does, so that a change inside the run cannot break it
unnoticed: the CLI in a subprocess (:func:`cpmatrix`), timed, and what the run wrote read
back through the public reader of ``report.xml`` (:func:`report`), never a world's own
files (their names and layout are the world protocol's, free to change).

Example::

    wall, proc = cpmatrix("run", "--matrix", "benchmarks/batching.yaml", "--out", "o")
    durations = {c.cell_id: c.time for c in report(Path("o"))}
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

from cpmatrix.report import ReportCell, read_report

__all__ = ["HERE", "ROOT", "add_batching_reps", "add_smoke", "cpmatrix", "report", "run_batching"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def cpmatrix(*args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None,
             codes: Iterable[int] = (0,)) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Wall seconds and the finished process of ``python -m cpmatrix ARGS``; the benchmark
    exits with the run's output when its exit code is not one of ``codes``."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "cpmatrix", *args], cwd=cwd,
                          env=None if env is None else dict(env), capture_output=True,
                          text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode not in tuple(codes):
        sys.exit(f"cpmatrix {' '.join(args[:1])} failed ({proc.returncode}):\n"
                 f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall, proc


def report(out: Path) -> list[ReportCell]:
    """The cells of the run that wrote ``out`` (its ``report.xml``; mutant runs left out)."""
    return [c for c in read_report(out / "report.xml") if not c.mutant]


def add_smoke(parser: argparse.ArgumentParser) -> None:
    """The ``--smoke`` option every benchmark has: its smallest size, seconds, numbers
    meaningless (``tests/e2e/test_benchmarks.py`` runs it to prove the script works)."""
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest size (seconds): proves the script runs; its "
                             "numbers mean nothing")


def add_batching_reps(parser: argparse.ArgumentParser) -> None:
    """``--reps N``: cells per mesh of ``batching.yaml`` (2x2 and 3x3), at most as many as
    its ``rep`` values, so that the cells a benchmark counts are the cells that ran."""
    target, = yaml.safe_load((HERE / "batching.yaml").read_text())["targets"]
    most = len(target["params"]["rep"])

    def reps(text: str) -> int:
        value = int(text)
        if not 1 <= value <= most:
            raise argparse.ArgumentTypeError(f"1 to {most} (batching.yaml's rep values)")
        return value

    parser.add_argument("--reps", type=reps, default=most,
                        help=f"cells per mesh, 2x2 and 3x3 (1 to {most}; default {most})")


def run_batching(out: Path, select: str, cells: int, *extra: str) -> float:
    """Wall seconds of ``cpmatrix run`` over ``batching.yaml``'s ``-k select`` into ``out``;
    the benchmark exits unless it ran exactly ``cells`` cells (the count it prints)."""
    wall, _ = cpmatrix("run", "--matrix", str(HERE / "batching.yaml"), "-k", select,
                       "--out", str(out), "--plain", "--no-cache", *extra)
    ran = len(report(out))
    if ran != cells:
        sys.exit(f"cpmatrix ran {ran} cells of {select!r}, {cells} expected")
    return wall
