"""The same test files natively and with ``pytest --cpmatrix``, in one run, as a ratio.

    python benchmarks/pytest_front.py [-k EXPR] [--suite DIR] [--order native-first]
                                      [--rounds N] [--smoke]

The suite (default: ``tests/resources/pytest_front_suites/dtensor``, 110 tests written on
torch's ``DTensorTestBase`` at world sizes 2 and 4, with expected failures and skips in
the mix) is run twice, each time by ``python -m pytest`` in its own folder:

- natively: torch's harness spawns each test's ranks (a fresh world per test);
- with ``--cpmatrix``: the tests run in cpmatrix's persistent worlds.

The two sides are interleaved, ``--rounds`` times (default 2: A B A B), so both see the
same load on a shared machine; the ratio is of the sums. It prints every run's wall
time and the load average when it started, the ratio, and
compares the outcome of every test (JUnit XML): a test that ends differently is listed
and the script exits 1. ``-k`` selects tests as pytest does (CI runs a handful; the full
native run takes tens of minutes on a 2-core machine); ``--smoke`` selects one 2-rank test.
Needs expecttest (torch's test harness imports it; in the ``dev`` and ``bench`` extras).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from _bench import ROOT, add_smoke

SUITE = ROOT / "tests" / "resources" / "pytest_front_suites" / "dtensor"
#: One 2-rank test that passes: a native world, a cpmatrix world, the comparison.
SMOKE = "ReducePairTest and test_reduce_op_sum_dim_0_placement_shard0"


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


def run(suite: Path, extra: list[str], keyword: str | None, junit: Path) -> tuple[float, str]:
    """Wall seconds of ``python -m pytest`` on the suite (in its folder); the summary."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           f"--junitxml={junit}", *extra, suite.name]
    if keyword:
        cmd += ["-k", keyword]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=suite.parent, env=env, capture_output=True, text=True,
                          check=False)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1) or not junit.exists():
        sys.exit(f"pytest {' '.join(extra)}: exit {proc.returncode}\n{proc.stdout[-3000:]}"
                 f"{proc.stderr[-3000:]}")
    last = [line for line in proc.stdout.splitlines() if line.strip()][-1]
    return wall, last


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", type=Path, default=SUITE)
    p.add_argument("-k", dest="keyword", default=None)
    p.add_argument("--order", choices=("native-first", "cpmatrix-first"),
                   default="cpmatrix-first")
    p.add_argument("--rounds", type=int, default=2,
                   help="native and --cpmatrix runs, interleaved (A B A B ...): 2")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR",
                   help="keep both runs' JUnit XML (native.xml, cpmatrix.xml) in DIR")
    add_smoke(p)
    args = p.parse_args()
    if args.smoke:
        args.keyword = SMOKE
    suite = args.suite.resolve()
    if args.rounds < 1:
        p.error("--rounds: at least 1")
    with tempfile.TemporaryDirectory(prefix="pytest-front-bench-") as tmp:
        runs = {"native": [], "cpmatrix": ["--cpmatrix", "--cpmatrix-out", f"{tmp}/out"]}
        order = list(runs) if args.order == "native-first" else list(reversed(runs))
        walls: dict[str, list[float]] = {name: [] for name in runs}
        found: dict[str, dict[str, str]] = {}
        unstable: set[str] = set()
        for i in range(args.rounds):
            for name in order:
                load = os.getloadavg()[0]
                junit = Path(tmp, f"{name}.xml")
                wall, summary = run(suite, runs[name], args.keyword, junit)
                walls[name].append(wall)
                got = outcomes(junit)
                if name in found:
                    unstable |= {k for k in got.keys() | found[name].keys()
                                 if got.get(k) != found[name].get(k)}
                found[name] = got
                if args.keep:
                    args.keep.mkdir(parents=True, exist_ok=True)
                    (args.keep / f"{name}{i}.xml").write_bytes(junit.read_bytes())
                print(f"{name:8} (round {i + 1}): {wall:7.1f} s wall ({len(got)} tests; load "
                      f"{load:.1f} at start): {summary}", flush=True)
    for name, ws in walls.items():
        print(f"{name:8}: {sum(ws):7.1f} s in {len(ws)} runs ({', '.join(f'{w:.1f}' for w in ws)})")
    if unstable:
        print(f"{len(unstable)} tests ended differently from one round to the next: "
              f"{', '.join(sorted(unstable))}")
    native, mine = found["native"], found["cpmatrix"]
    differ = sorted(k for k in native.keys() | mine.keys() if native.get(k) != mine.get(k))
    counts: dict[str, int] = {}
    for outcome in native.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    print(f"outcomes (native): {', '.join(f'{n} {k}' for k, n in sorted(counts.items()))}")
    print(f"ratio native / --cpmatrix: {sum(walls['native']) / sum(walls['cpmatrix']):.1f}x "
          "(interleaved, the same load)")
    if differ or unstable:
        print(f"{len(differ)} tests ended differently:")
        for k in differ:
            print(f"  {k}: native {native.get(k)}, --cpmatrix {mine.get(k)}")
        return 1
    print(f"every test ended the same way ({len(native)} tests)")
    if args.smoke and set(native.values()) != {"passed"}:
        # Two runs that both fail (or collect nothing) also "end the same way".
        print(f"the smoke test did not pass natively: {native}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
