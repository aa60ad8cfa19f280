"""Mutation-test the verdict core with mutmut and print the score per module.

    python tools/mutation_score.py                      # every module of [tool.mutmut]
    python tools/mutation_score.py --only parity        # modules whose path contains "parity"
    python tools/mutation_score.py --report-only DIR    # re-read a finished run in DIR
    python tools/mutation_score.py --fail-under 90      # exit 1 if a module scores lower

mutmut (3.x) reads ``[tool.mutmut]`` of ``pyproject.toml``: the modules (``only_mutate``)
and the fast tests that must kill their mutants. It writes its ``mutants/`` folder next to
that file, and reuses any mutated copy it finds there, so each run starts from a fresh copy
of the project in a scratch folder (``--workdir``, default ``.nox/mutation-work``), whose
``only_mutate`` lists the chosen modules, and the checkout stays clean.

The score counts a mutant no test reaches ("no tests") as surviving:
``score = (killed + timeout) / mutants`` (a mutant that makes the tests hang is detected).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What the tests need besides src/ and tests/ (mutmut copies those, and pyproject.toml).
COPY = ("src", "tests", "pyproject.toml", "README.md", "matrix", "docs")

#: mutmut's exit codes per mutant (mutmut/stats.py), folded into our columns.
KILLED = {1, 3}
TIMEOUT = {24, -24, 152, 255, 36}
SURVIVED = {0}
NOT_REACHED = {5, 33}


@dataclass(frozen=True, slots=True)
class Score:
    """One module's mutants by outcome."""

    module: str
    mutants: int
    killed: int
    timeout: int
    survived: int
    not_reached: int
    other: int

    @property
    def score(self) -> float:
        return 100.0 * (self.killed + self.timeout) / self.mutants if self.mutants else 100.0


def modules_of(pyproject: Path) -> list[str]:
    """The files ``[tool.mutmut] only_mutate`` names (plain paths, no patterns)."""
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["mutmut"]
    return [str(p) for p in config["only_mutate"]]


def dotted(path: str) -> str:
    """``src/cpmatrix/parity/compare.py`` -> ``cpmatrix.parity.compare`` (mutant prefix)."""
    return path.removeprefix("src/").removesuffix(".py").replace("/", ".")


def prepare(workdir: Path, modules: list[str]) -> None:
    """A fresh copy of what the tests need (mutmut must not find stale mutants), its
    ``only_mutate`` narrowed to ``modules``."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", "out")
    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, workdir / name, ignore=ignore)
        else:
            shutil.copy2(src, workdir / name)
    pyproject = workdir / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    listed = re.compile(r"^only_mutate = \[.*?^\]", re.MULTILINE | re.DOTALL)
    assert len(listed.findall(text)) == 1, "[tool.mutmut] only_mutate must be one list"
    pyproject.write_text(listed.sub(lambda _: f"only_mutate = {json.dumps(modules)}", text),
                         encoding="utf-8")


def run_mutmut(workdir: Path, jobs: int) -> float:
    """``mutmut run`` in ``workdir``; returns the wall time in seconds."""
    start = time.monotonic()
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs)]
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=workdir, check=False)  # its progress goes to our stdout
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        # mutmut exits 0 whatever survives; anything else is a broken run (a failing clean
        # test run, a config error): no table of zeros
        raise SystemExit(f"mutmut run failed with exit code {proc.returncode}")
    return elapsed


def scores(workdir: Path, modules: list[str]) -> tuple[list[Score], dict[str, list[str]]]:
    """Per module: the score, and the names of the mutants that were not killed."""
    out, survivors = [], {}
    for module in modules:
        meta = workdir / "mutants" / f"{module}.meta"
        codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        prefix = dotted(module) + "."
        codes = {k: v for k, v in codes.items() if k.startswith(prefix)}
        count = Counter(
            "killed" if c in KILLED else "timeout" if c in TIMEOUT else
            "survived" if c in SURVIVED else "not_reached" if c in NOT_REACHED else "other"
            for c in codes.values()
        )
        out.append(Score(module=module, mutants=len(codes), killed=count["killed"],
                         timeout=count["timeout"], survived=count["survived"],
                         not_reached=count["not_reached"], other=count["other"]))
        survivors[module] = sorted(k for k, c in codes.items()
                                   if c not in KILLED and c not in TIMEOUT)
    return out, survivors


def table(rows: list[Score]) -> str:
    """The Markdown table docs/verdict-core.md keeps."""
    lines = ["| module | mutants | killed | timeout | survived | not reached | other | score |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.module.removeprefix('src/cpmatrix/')} | {r.mutants} | {r.killed} | "
                     f"{r.timeout} | {r.survived} | {r.not_reached} | {r.other} | "
                     f"{r.score:.1f}% |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=ROOT / ".nox" / "mutation-work")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2,
                        help="mutants tested at once (mutmut --max-children)")
    parser.add_argument("--only", action="append", default=[],
                        help="keep modules whose path matches this glob or contains it")
    parser.add_argument("--report-only", action="store_true",
                        help="read the results already in --workdir, run nothing")
    parser.add_argument("--survivors", action="store_true", help="list the mutants not killed")
    parser.add_argument("--fail-under", type=float, default=0.0,
                        help="exit 1 if a module's score (percent) is below this")
    args = parser.parse_args(argv)

    modules = modules_of(ROOT / "pyproject.toml")
    if args.only:
        modules = [m for m in modules
                   if any(pat in m or fnmatch.fnmatch(m, pat) for pat in args.only)]
        if not modules:
            parser.error(f"--only {args.only} matches no module of [tool.mutmut] only_mutate")
    if not args.report_only:
        prepare(args.workdir, modules)
        elapsed = run_mutmut(args.workdir, args.jobs)
        print(f"mutmut wall time: {elapsed:.0f} s with {args.jobs} jobs")
    rows, survivors = scores(args.workdir, modules)
    print(table(rows))
    if args.survivors:
        for name in (n for names in survivors.values() for n in names):
            print(f"not killed: {name}")
    low = [r for r in rows if r.score < args.fail_under]
    for r in low:
        print(f"error: {r.module} scores {r.score:.1f}% < {args.fail_under:g}%", file=sys.stderr)
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
