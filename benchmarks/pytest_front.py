"""The same test files natively and with ``pytest --cpmatrix``, interleaved, as a ratio.

    python benchmarks/pytest_front.py [-k EXPR] [--suite DIR] [--rounds N]
                                      [--order native-first] [--keep DIR] [--smoke]
                                      [-- FILE ...]

The suite (default: ``tests/resources/pytest_front_suites/dtensor``, 110 tests written on
torch's ``DTensorTestBase`` at world sizes 2 and 4, with expected failures and skips in
the mix) is run by ``python -m pytest``, natively and with ``--cpmatrix``:

- natively: torch's harness spawns each test's ranks (a fresh world per test);
- with ``--cpmatrix``: the tests run in cpmatrix's persistent worlds.

The two sides are **interleaved**, ``--rounds`` times (default 2: A B B A; the side that
goes first alternates from round to round, so neither always runs on the machine the
other has just warmed or loaded). A ratio of two runs made minutes apart on a shared
machine measures the load as much as the runs. It prints, for every single run, its wall
time and the 1-minute load average at its start and at its end; then each round's ratio
and the median of those ratios.

Outcomes are compared per test (JUnit XML): every run against the first native run; a
test that ends differently on either side, or from one round to the next, is listed and
the script exits 1.

An external suite (files nobody here wrote, e.g. PyTorch's own DTensor tests in a
checkout outside this repository) is run in its own folder, with its own ``conftest.py``
and ini file, on the files named after ``--`` (or with ``--files``), relative to it::

    python benchmarks/pytest_front.py --suite /path/to/pytorch --rounds 2 -- \\
        test/distributed/tensor/test_init.py test/distributed/tensor/test_api.py

Without files, the suite folder itself is collected from its parent (the default suite).
``-k`` selects tests as pytest does (the full native run of the default suite takes tens
of minutes on a 2-core machine); ``--smoke`` selects one 2-rank test of the default
suite, one round. Needs expecttest (torch's test harness imports it; in the ``dev`` and
``bench`` extras).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from _bench import ROOT, add_smoke

SUITE = ROOT / "tests" / "resources" / "pytest_front_suites" / "dtensor"
#: One 2-rank test that passes: a native world, a cpmatrix world, the comparison.
SMOKE = "ReducePairTest and test_reduce_op_sum_dim_0_placement_shard0"
SIDES = ("native", "cpmatrix")


@dataclass(frozen=True)
class Run:
    """One ``python -m pytest`` run: its side, round, wall seconds, loads, outcomes."""

    side: str
    round: int
    wall: float
    load_start: float
    load_end: float
    summary: str
    outcomes: dict[str, str]


def outcomes(junit: Path) -> dict[str, str]:
    """``classname::name`` -> passed, failed, error, skipped, xfailed."""
    found: dict[str, str] = {}
    for case in ET.parse(junit).iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "error"
                break
            if child.tag == "skipped":
                outcome = "xfailed" if child.get("type") == "pytest.xfail" else "skipped"
        found[f"{case.get('classname')}::{case.get('name')}"] = outcome
    return found


def run(cwd: Path, targets: list[str], extra: list[str], keyword: str | None,
        junit: Path) -> tuple[float, str]:
    """Wall seconds of ``python -m pytest TARGETS`` in ``cwd``; its summary line."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           f"--junitxml={junit}", *extra, *targets]
    if keyword:
        cmd += ["-k", keyword]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1) or not junit.exists():
        sys.exit(f"pytest {' '.join(extra[:1])}: exit {proc.returncode}\n{proc.stdout[-3000:]}"
                 f"{proc.stderr[-3000:]}")
    last = [line for line in proc.stdout.splitlines() if line.strip()][-1]
    return wall, last


def order_of(first: str, round_: int) -> list[str]:
    """The sides of round ``round_`` (0-based): ``first`` leads the even rounds."""
    lead = first if round_ % 2 == 0 else next(s for s in SIDES if s != first)
    return [lead, next(s for s in SIDES if s != lead)]


def differences(runs: list[Run]) -> list[str]:
    """One line per test that ends differently in some run than in the first native run."""
    base = next(r for r in runs if r.side == "native").outcomes
    lines = []
    for key in sorted(set().union(*(r.outcomes.keys() for r in runs))):
        seen = [f"{r.side}#{r.round + 1} {r.outcomes.get(key, 'missing')}" for r in runs
                if r.outcomes.get(key) != base.get(key)]
        if seen:
            lines.append(f"  {key}: native#1 {base.get(key, 'missing')}; {', '.join(seen)}")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", type=Path, default=SUITE,
                   help="the suite's folder (with FILEs: the folder pytest runs in)")
    p.add_argument("--files", nargs="+", default=[], metavar="FILE",
                   help="test files relative to --suite (as after --)")
    p.add_argument("files_after", nargs="*", default=[], metavar="FILE",
                   help="test files relative to --suite")
    p.add_argument("-k", dest="keyword", default=None)
    p.add_argument("--rounds", type=int, default=2,
                   help="native and --cpmatrix runs each, interleaved (default 2)")
    p.add_argument("--order", choices=("native-first", "cpmatrix-first"),
                   default="cpmatrix-first", help="which side leads the first round")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR",
                   help="keep every run's JUnit XML (native1.xml, cpmatrix1.xml, ...) in DIR")
    add_smoke(p)
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds: at least 1")
    if args.smoke:
        args.keyword, args.rounds = SMOKE, 1
    suite = args.suite.resolve()
    if not suite.is_dir():
        p.error(f"--suite {args.suite}: not a folder")
    files = [*args.files, *args.files_after]
    for name in files:
        if not (suite / name.split("::")[0]).exists():
            p.error(f"{name}: no such file under {suite}")
    cwd, targets = (suite, files) if files else (suite.parent, [suite.name])
    first = args.order.split("-")[0]
    runs: list[Run] = []
    print(f"suite {suite}: {' '.join(targets)}" + (f" -k {args.keyword!r}" if args.keyword
                                                     else ""), flush=True)
    with tempfile.TemporaryDirectory(prefix="pytest-front-bench-") as tmp:
        # ``--cpmatrix-out=DIR``, not ``--cpmatrix-out DIR``: pytest takes a separate
        # argument that is an existing path for a test path when it derives the rootdir,
        # so from the second run on (DIR exists) a suite without an ini file would be
        # rooted at the common ancestor of DIR and the tests (``/``), its node ids too.
        extra = {"native": [], "cpmatrix": ["--cpmatrix", f"--cpmatrix-out={tmp}/out"]}
        for i in range(args.rounds):
            for side in order_of(first, i):
                junit = Path(tmp, f"{side}{i + 1}.xml")
                load_start = os.getloadavg()[0]
                wall, summary = run(cwd, targets, extra[side], args.keyword, junit)
                done = Run(side, i, wall, load_start, os.getloadavg()[0], summary,
                           outcomes(junit))
                runs.append(done)
                if args.keep:
                    args.keep.mkdir(parents=True, exist_ok=True)
                    (args.keep / junit.name).write_bytes(junit.read_bytes())
                print(f"round {i + 1} {side:8}: {wall:7.1f} s wall, {len(done.outcomes)} "
                      f"tests, load {load_start:.1f} -> {done.load_end:.1f}: {summary}",
                      flush=True)
    ratios = []
    for i in range(args.rounds):
        native, mine = (next(r.wall for r in runs if r.round == i and r.side == s)
                        for s in SIDES)
        ratios.append(native / mine)
        print(f"round {i + 1}: native {native:.1f} s / --cpmatrix {mine:.1f} s = "
              f"{ratios[-1]:.1f}x")
    loads = [x for r in runs for x in (r.load_start, r.load_end)]
    print(f"median ratio native / --cpmatrix: {statistics.median(ratios):.1f}x over "
          f"{args.rounds} interleaved round(s); load {min(loads):.1f} to {max(loads):.1f}")
    base = next(r for r in runs if r.side == "native").outcomes
    counts: dict[str, int] = {}
    for outcome in base.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    print(f"outcomes (native): {', '.join(f'{n} {k}' for k, n in sorted(counts.items()))}")
    differ = differences(runs)
    if differ:
        print(f"{len(differ)} tests ended differently (against the first native run):")
        print("\n".join(differ))
        return 1
    print(f"every test ended the same way in every run ({len(base)} tests)")
    if args.smoke and set(base.values()) != {"passed"}:
        # Two runs that both fail (or collect nothing) also "end the same way".
        print(f"the smoke test did not pass natively: {base}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
