"""``cpmatrix run --order`` on the command line: the dry run prints the order and its
seed, the seed repeats the plan, a bad order is a usage error. The ordering's own tests
are ``tests/unit/test_ordering.py``."""

from __future__ import annotations

import re

from cli_runner import RES, run_cli


def _planned(*extra: str) -> tuple[str, list[str]]:
    """The dry run's output and its cells in the order they run (one at a time)."""
    proc = run_cli("run", "--matrix", str(RES / "runtime.yaml"), "--dry-run", "--pack",
                   "serial", *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cells = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  ")
             and "ranks" in line]
    return proc.stdout, cells


def test_the_order_is_printed_and_a_seed_repeats_the_plan() -> None:
    _, matrix = _planned("--order", "matrix")
    _, reverse = _planned("--order", "reverse")
    assert matrix and reverse == matrix[::-1]
    out, shuffled = _planned("--order", "random")
    seed = re.search(r"^order: random:(\d+) \(--order random:\1 runs this order again\)$",
                     out, re.M)
    assert seed is not None, out
    assert _planned("--order", f"random:{seed.group(1)}")[1] == shuffled
    assert sorted(shuffled) == sorted(matrix)
    proc = run_cli("run", "--matrix", str(RES / "runtime.yaml"), "--order", "upside-down")
    assert proc.returncode == 2 and "--order 'upside-down'" in proc.stderr
