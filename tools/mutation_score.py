"""Mutation-test the verdict core with mutmut and print the score per module.

    python tools/mutation_score.py                      # every module of [tool.mutmut]
    python tools/mutation_score.py --only parity        # modules whose path contains "parity"
    python tools/mutation_score.py --report-only DIR    # re-read a finished run in DIR
    python tools/mutation_score.py --fail-under 90      # exit 1 if a module scores lower
    python tools/mutation_score.py --record             # ... and write the stamp below
    python tools/mutation_score.py --changed-only --fail-under 90   # what CI runs

mutmut (3.x) reads ``[tool.mutmut]`` of ``pyproject.toml``: the modules (``only_mutate``)
and the fast tests that must kill their mutants. It writes its ``mutants/`` folder next to
that file, and reuses any mutated copy it finds there, so each run starts from a fresh copy
of the project in a scratch folder (``--workdir``, default ``.nox/mutation-work``), whose
``only_mutate`` lists the chosen modules, and the checkout stays clean.

The score counts a mutant no test reaches ("no tests") as surviving:
``score = (killed + timeout) / mutants`` (a mutant that makes the tests hang is detected).

**Which tests judge which module**: ``[[tool.mutation_score.group]]`` in ``pyproject.toml``
lists groups of modules with the test files that judge them; each group is mutated in a
workdir of its own (``WORKDIR/<n>``, n its place among the groups) against exactly its
tests, so a module's score never counts another group's tests.

**The stamp** (``tools/mutation-stamp.json``, written by ``--record``): per module, the
score a real run reached and the hash of everything that score depends on: the module's
source, every test file mutmut runs against it (its group's tests, conftest, and the shared
helpers they import), the ``[tool.mutmut]`` settings but the list of mutated modules, and
this tool. Editing one group's tests leaves the other groups' stamps standing. With
``--changed-only`` (what CI runs) a module whose hash matches its stamp, with a recorded
score at or above ``--fail-under``, is not mutated again: the tool prints its recorded
score, the date and the hash it matched. Every other module runs. Nothing is skipped
silently, and a stamp cannot vouch for code or tests it did not see.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import hashlib
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

#: Scores of the last recorded run and what they depended on (see the module docstring).
STAMP = ROOT / "tools" / "mutation-stamp.json"

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


class ConfigError(Exception):
    """``[tool.mutation_score]`` does not say which tests judge a module."""


def groups_of(root: Path) -> list[tuple[list[str], list[str]]]:
    """``[[tool.mutation_score.group]]``: (modules, test files) per group, checked: every
    module of ``only_mutate`` in exactly one group, every test file present."""
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]
    raw = config.get("mutation_score", {}).get("group", [])
    groups = [([str(m) for m in g.get("modules", [])], [str(t) for t in g.get("tests", [])])
              for g in raw]
    where: dict[str, int] = {}
    for i, (modules, tests) in enumerate(groups):
        if not modules or not tests:
            raise ConfigError(f"pyproject.toml: [[tool.mutation_score.group]] number {i + 1} "
                              "needs both modules and tests")
        for test in tests:
            if not (root / test).is_file():
                raise ConfigError(f"pyproject.toml: [[tool.mutation_score.group]] number "
                                  f"{i + 1}: no such test file {test}")
        for module in modules:
            if module in where:
                raise ConfigError(f"pyproject.toml: {module} is in two "
                                  "[[tool.mutation_score.group]] tables")
            where[module] = i
    missing = [m for m in config["mutmut"]["only_mutate"] if m not in where]
    if missing:
        raise ConfigError(f"pyproject.toml: no [[tool.mutation_score.group]] names the tests "
                          f"that judge {', '.join(missing)} (each module of [tool.mutmut] "
                          "only_mutate needs one)")
    return groups


def group_of(root: Path, module: str) -> int:
    """The index of ``module``'s group in ``[[tool.mutation_score.group]]``."""
    for i, (modules, _tests) in enumerate(groups_of(root)):
        if module in modules:
            return i
    raise ConfigError(f"pyproject.toml: {module} is in no [[tool.mutation_score.group]]")


def test_files(root: Path, module: str) -> list[Path]:
    """The test files ``module``'s mutants are judged by: its group's tests,
    ``tests/conftest.py`` (pytest loads it for every test) and the shared helpers beside
    them (``tests/*.py``) that these import, directly or through another helper, sorted. A
    helper no judging test imports (the pytest front's runner, the cache server's fixture)
    cannot move a score."""
    named = {root / t for t in groups_of(root)[group_of(root, module)][1]}
    helpers = {p.stem: p for p in (root / "tests").glob("*.py")}
    found: set[Path] = {helpers["conftest"]} if "conftest" in helpers else set()
    todo = sorted(named | found)
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        for name in imported_names(path):
            helper = helpers.get(name)
            if helper is not None and helper not in found:
                found.add(helper)
                todo.append(helper)
    return sorted(named | found)


def imported_names(path: Path) -> set[str]:
    """The top-level names of the modules a Python file imports (absolute imports)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def input_hash(root: Path, module: str) -> str:
    """sha256 over what a module's score depends on: its source, the test files, the
    ``[tool.mutmut]`` settings and this tool (each named, so a moved byte counts)."""
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    # The list of mutated modules is left out: adding a module moves no other's score.
    settings = {k: v for k, v in config["tool"]["mutmut"].items() if k != "only_mutate"}
    h = hashlib.sha256(b"cpmatrix-mutation-stamp-v2\0")
    h.update(json.dumps(settings, sort_keys=True).encode())
    for path in [root / module, *test_files(root, module),
                 root / "tools" / "mutation_score.py"]:
        h.update(b"\0" + str(path.relative_to(root)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def read_stamp(path: Path) -> dict[str, dict[str, object]]:
    """Module path -> its recorded entry; {} for a missing or unreadable stamp."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    modules = data.get("modules") if isinstance(data, dict) else None
    return {str(k): v for k, v in modules.items() if isinstance(v, dict)} \
        if isinstance(modules, dict) else {}


def unchanged(stamp: dict[str, dict[str, object]], module: str, digest: str,
              fail_under: float) -> dict[str, object] | None:
    """The stamp entry that vouches for ``module`` (same inputs, a recorded score at or
    above ``fail_under``), else None: the module must be mutated again."""
    entry = stamp.get(module)
    if entry is None or entry.get("hash") != digest:
        return None
    score = entry.get("score")
    if not isinstance(score, int | float) or score < fail_under:
        return None
    return entry


def record(path: Path, digests: dict[str, str], rows: list[Score]) -> None:
    """Merge this run's scores into the stamp (other modules keep their entries).

    ``digests`` are the input hashes taken before the run copied the sources: an edit
    made while mutmut ran is not vouched for."""
    data = {"modules": read_stamp(path)}
    for r in rows:
        data["modules"][r.module] = {
            "hash": digests[r.module], "score": round(r.score, 1),
            "mutants": r.mutants, "killed": r.killed + r.timeout,
            "date": time.strftime("%Y-%m-%d"),
        }
    data["modules"] = dict(sorted(data["modules"].items()))
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def dotted(path: str) -> str:
    """``src/cpmatrix/parity/compare.py`` -> ``cpmatrix.parity.compare`` (mutant prefix)."""
    return path.removeprefix("src/").removesuffix(".py").replace("/", ".")


def prepare(workdir: Path, modules: list[str], tests: list[str]) -> None:
    """A fresh copy of what the tests need (mutmut must not find stale mutants), its
    ``only_mutate`` narrowed to ``modules`` and its test selection to ``tests`` (after
    the selection's options, e.g. ``-m``)."""
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
    text = listed.sub(lambda _: f"only_mutate = {json.dumps(modules)}", text)
    selection = re.compile(r"^pytest_add_cli_args_test_selection = (\[.*?\])$",
                           re.MULTILINE | re.DOTALL)
    found = selection.findall(text)
    assert len(found) == 1, "[tool.mutmut] pytest_add_cli_args_test_selection: one list"
    options = [a for a in json.loads(found[0]) if not a.endswith(".py")]
    pyproject.write_text(selection.sub(
        lambda _: f"pytest_add_cli_args_test_selection = {json.dumps(tests + options)}",
        text), encoding="utf-8")


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
    parser.add_argument("--record", action="store_true",
                        help=f"write this run's scores into the stamp ({STAMP.name})")
    parser.add_argument("--changed-only", action="store_true",
                        help="mutate only the modules whose sources, tests or settings "
                        "changed since the stamp (or whose recorded score is too low)")
    parser.add_argument("--stamp", type=Path, default=STAMP, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    modules = modules_of(ROOT / "pyproject.toml")
    if args.only:
        modules = [m for m in modules
                   if any(pat in m or fnmatch.fnmatch(m, pat) for pat in args.only)]
        if not modules:
            parser.error(f"--only {args.only} matches no module of [tool.mutmut] only_mutate")
    if args.record and args.report_only:
        parser.error("--record needs a run (a finished workdir may hold other sources)")
    try:
        groups = groups_of(ROOT)
        digests = {m: input_hash(ROOT, m) for m in modules}
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.changed_only:
        stamp = read_stamp(args.stamp)
        kept = []
        for module in modules:
            digest = digests[module]
            entry = unchanged(stamp, module, digest, args.fail_under)
            if entry is None:
                why = ("no recorded run" if module not in stamp else
                       "its source, tests or settings changed" if stamp[module].get("hash")
                       != digest else f"its recorded score {stamp[module].get('score')}% "
                       f"is below {args.fail_under:g}%")
                print(f"mutation: {module}: mutating ({why})")
                kept.append(module)
            else:
                print(f"mutation: {module}: unchanged since {entry.get('date')} (inputs "
                      f"{digest[:12]} as recorded): {entry.get('score')}% "
                      f"({entry.get('killed')}/{entry.get('mutants')}), not run again")
        modules = kept
        if not modules:
            print("mutation: every module's score stands (tools/mutation-stamp.json)")
            return 0
    rows: list[Score] = []
    survivors: dict[str, list[str]] = {}
    for i, (members, tests) in enumerate(groups):
        chosen = [m for m in modules if m in members]
        if not chosen:
            continue
        workdir = args.workdir / str(i)
        if not args.report_only:
            prepare(workdir, chosen, tests)
            elapsed = run_mutmut(workdir, args.jobs)
            print(f"mutmut wall time: {elapsed:.0f} s with {args.jobs} jobs "
                  f"({len(chosen)} module(s) against {len(tests)} test file(s))")
        found, missed = scores(workdir, chosen)
        rows += found
        survivors.update(missed)
    print(table(rows))
    if args.survivors:
        for name in (n for names in survivors.values() for n in names):
            print(f"not killed: {name}")
    if args.record:
        record(args.stamp, digests, rows)
        print(f"recorded in {args.stamp}")
    low = [r for r in rows if r.score < args.fail_under]
    for r in low:
        print(f"error: {r.module} scores {r.score:.1f}% < {args.fail_under:g}%", file=sys.stderr)
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
