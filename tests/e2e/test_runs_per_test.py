"""``cpmatrix run --runs-per-test N`` and the flake history, on real gloo worlds.

One module-scoped pair of runs of a three-cell matrix (tests/resources/flaky.yaml: a
stable cell, a planted flake failing every third run, a broken cell) serves every check:
run A with ``--runs-per-test 5`` (and an old-form ``--durations-from`` baseline), run B a
plain run of the stable cell (the control: its cache is written, its seed is run 1's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from cli_runner import RES, run_cli
from cpmatrix.cell import seed_for
from cpmatrix.report import read_report
from cpmatrix.report.history import read_histories

pytestmark = pytest.mark.slow

MATRIX = RES / "flaky.yaml"
STABLE = "stable[unit,1x2,fp64,autocast=off,reference]@cpu"
FLAKY = "flaky[unit,1x1,fp64,autocast=off,reference]@cpu"
BROKEN = "broken[unit,1x1,fp64,autocast=off,reference]@cpu"
GONE = "gone[unit,1x1,fp64,autocast=off,reference]@cpu"
RUNS = 5


@dataclass(frozen=True)
class Runs:
    root: Path
    a: Path
    b: Path
    stdout: str
    rc: int

    def rows(self, out: Path) -> dict[str, dict[str, object]]:
        return {r["cell_id"]: r for r in json.loads((out / "results.json").read_text())}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    root = tmp_path_factory.mktemp("runs")
    baseline = root / "baseline.json"  # the form before histories: seconds only
    baseline.write_text(json.dumps({GONE: 9.0, STABLE: 0.5}))
    a = run_cli("run", "--matrix", str(MATRIX), "--runs-per-test", str(RUNS), "--plain",
                "--out", str(root / "a"), "--cache-dir", str(root / "cache-a"),
                "--durations-from", str(baseline))
    b = run_cli("run", "--matrix", str(MATRIX), "-k", "stable", "--plain",
                "--out", str(root / "b"), "--cache-dir", str(root / "cache-b"))
    assert b.returncode == 0, b.stdout + b.stderr
    return Runs(root=root, a=root / "a", b=root / "b", stdout=a.stdout + a.stderr,
                rc=a.returncode)


def test_verdicts_and_counts(runs: Runs) -> None:
    # A broken cell fails the run (exit 1); the planted flake is FLAKY with its counts.
    assert runs.rc == 1, runs.stdout
    rows = runs.rows(runs.a)
    assert set(rows) == {STABLE, FLAKY, BROKEN}  # one row per cell, not per run
    got = {c: (r["status"], r["runs"], r["runs_passed"]) for c, r in rows.items()}
    assert got == {STABLE: ("passed", 5, 5), FLAKY: ("flaky", 5, 4), BROKEN: ("failed", 5, 0)}
    assert rows[FLAKY]["run_failures"] == [
        "run 3: failed (error) on rank 0: AssertionError: planted flake: run 3 fails"]
    assert len(rows[BROKEN]["run_failures"]) == 5  # type: ignore[arg-type]
    assert "==== 3 cells: 1 passed, 1 failed, 1 flaky" in runs.stdout
    assert "  runs: 4/5 passed" in runs.stdout and "  runs: 0/5 passed" in runs.stdout


def test_junit_one_testcase_per_cell_with_counts(runs: Runs) -> None:
    cases = {c.name: c for c in read_report(runs.a / "report.xml")}
    assert set(cases) == {STABLE, FLAKY, BROKEN}
    p = {name: c.properties for name, c in cases.items()}
    assert (p[FLAKY]["status"], p[FLAKY]["runs"], p[FLAKY]["runs_passed"],
            p[FLAKY]["runs_failed"]) == ("flaky", "5", "4", "1")
    assert p[FLAKY]["run_failure.1"].startswith("run 3: failed (error) on rank 0: ")
    assert "run_failure.2" not in p[FLAKY]
    assert (p[STABLE]["runs_passed"], p[STABLE]["runs_failed"]) == ("5", "0")
    assert (p[BROKEN]["runs_passed"], p[BROKEN]["runs_failed"]) == ("0", "5")
    assert [p[BROKEN][f"run_failure.{i}"][:6] for i in range(1, 6)] == [
        f"run {i}:" for i in range(1, 6)]
    assert "--- run 5: failed" in cases[BROKEN].text


def test_every_run_has_its_run_number_and_seed(runs: Runs) -> None:
    for cell in (STABLE, FLAKY, BROKEN):
        seen = [(runs.a / "cells" / cell / f"run-{k}" / "rank0" / "run.txt").read_text().split()
                for k in range(1, RUNS + 1)]
        assert [int(n) for n, _ in seen] == list(range(1, RUNS + 1)), cell
        assert [int(s) for _, s in seen] == [seed_for(cell, k) for k in range(1, RUNS + 1)]
        assert len({s for _, s in seen}) == RUNS
    # Run 1 keeps a plain run's seed (and draws): N=1 is unchanged.
    plain = runs.rows(runs.b)[STABLE]["evidence"]
    first = runs.rows(runs.a)[STABLE]["evidence"]  # a passing cell reports run 1's evidence
    assert plain["seed"] == first["seed"] == seed_for(STABLE)  # type: ignore[index]
    assert plain["draw"] == first["draw"] and plain["run_number"] == 1  # type: ignore[index]


def test_no_cache_lookup_or_store_with_n_runs(runs: Runs) -> None:
    assert "cache: off (--runs-per-test 5" in runs.stdout
    stored = [p for p in (runs.root / "cache-a").rglob("*") if p.is_file()]
    assert stored == []
    # The control: the same cell run once stores its pass.
    assert any(p.is_file() for p in (runs.root / "cache-b").rglob("*"))


def test_history_records_every_run(runs: Runs) -> None:
    h = read_histories(runs.a / "durations.json")
    assert [r.outcome for r in h[FLAKY].runs] == ["passed", "passed", "failed", "passed",
                                                  "passed"]
    assert h[FLAKY].flipped and h[FLAKY].flake_rate == pytest.approx(0.2)
    assert [r.outcome for r in h[BROKEN].runs] == ["failed"] * 5
    assert not h[BROKEN].flipped and h[BROKEN].duration_s is None
    assert not h[STABLE].flipped and len(h[STABLE].runs) == 5
    assert h[STABLE].duration_s != 0.5  # this run's, not the baseline's
    # The old-form baseline was read and carried on.
    assert h[GONE].duration_s == 9.0 and h[GONE].runs == ()


def test_merge_unites_histories(runs: Runs) -> None:
    merged = runs.root / "m"
    proc = run_cli("merge", str(runs.a), str(runs.b), "--out", str(merged))
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    h = read_histories(merged / "durations.json")
    b = read_histories(runs.b / "durations.json")
    assert len(h[STABLE].runs) == 6 and b[STABLE].runs[0] in h[STABLE].runs
    assert [r.outcome for r in h[FLAKY].runs].count("failed") == 1
    assert h[GONE].duration_s == 9.0
    # A folder merged with itself adds nothing twice.
    again = runs.root / "m2"
    assert run_cli("merge", str(runs.a), str(runs.a), "--out", str(again)).returncode in (0, 1)
    assert read_histories(again / "durations.json")[FLAKY].runs == h[FLAKY].runs


def test_show_history(runs: Runs) -> None:
    proc = run_cli("show", FLAKY, "--history", "--out", str(runs.a))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == FLAKY
    assert ("runs: 5 kept, 4 passed, 1 failed; flake rate 20%; flipped in its history: "
            "4 passed, 1 failed of the last 5 runs (flake rate 20%)") in lines
    assert [ln.split()[3] for ln in lines if ln.endswith(" s") and " UTC " in ln] == [
        "passed", "passed", "failed", "passed", "passed"]
    broken = run_cli("show", BROKEN, "--history", "--durations-from",
                     str(runs.a / "durations.json"), "--json")
    data = json.loads(broken.stdout)["history"]
    assert (data["passed"], data["failed"], data["flipped"], data["duration_s"]) == (
        0, 5, False, None)
    old = run_cli("show", GONE, "--history", "--out", str(runs.a))
    assert old.returncode == 0 and "runs: none recorded" in old.stdout


@pytest.mark.parametrize(("argv", "rc", "message"), [
    (["show", "flaky[unit,2x2,fp64,autocast=off,reference]@cpu", "--history"], 3,
     f"no history of 'flaky[unit,2x2,fp64,autocast=off,reference]@cpu' in {{a}}/durations.json"
     f" (4 cells recorded); cells of that target with a history: {FLAKY}"),
    (["show", "flaky[unit]@cpu", "--history"], 2, "error: malformed cell id"),
    (["show", FLAKY, "--history", "--out", "{root}/nowhere"], 2,
     "error: --history: no {root}/nowhere/durations.json"),
    (["show", FLAKY, "--history", "--durations-from", "{root}/baseline.json", "--out",
      "{a}"], 2,
     "not allowed with argument"),
    (["show", FLAKY, "--durations-from", "{root}/baseline.json"], 2,
     "error: --durations-from goes with --history"),
    (["show", FLAKY, "--history", "--durations", "{root}/baseline.json"], 2,
     "--durations: is now --durations-from {root}/baseline.json"),
], ids=["unknown-cell", "malformed-id", "no-file", "two-sources", "durations-without-history",
        "old-spelling"])
def test_show_history_errors(runs: Runs, argv: list[str], rc: int, message: str) -> None:
    fill = {"a": str(runs.a), "root": str(runs.root)}
    argv = [a.format(**fill) for a in argv]
    if "--out" not in argv and "--durations-from" not in argv and "--history" in argv:
        argv += ["--out", str(runs.a)]
    proc = run_cli(*argv)
    assert proc.returncode == rc, proc.stdout + proc.stderr
    assert message.format(**fill) in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_show_history_of_a_damaged_file(runs: Runs) -> None:
    bad = runs.root / "bad.json"
    bad.write_text(json.dumps({FLAKY: {"duration_s": 1.0, "runs": [{"at": "yesterday"}]}}))
    proc = run_cli("show", FLAKY, "--history", "--durations-from", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: --history: {bad}: {FLAKY}: runs[0] must be"), \
        proc.stderr


def test_html_marks_the_flipped_cell(runs: Runs) -> None:
    page = (runs.a / "report.html").read_text()
    assert page.count('data-flipped="1"') == 1
    square = page[page.index('data-flipped="1"'):].split("</button>", 1)[0]
    assert FLAKY in square and "flipped in its history: 4 passed, 1 failed" in square
    section = page[page.index('id="flipped"'):].split("</section>", 1)[0]
    assert FLAKY in section and STABLE not in section and BROKEN not in section
    assert "runs: 4/5 passed" in square


def test_flaky_fails_the_gate_unless_allowed(runs: Runs) -> None:
    gates = runs.root / "gates.yaml"
    gates.write_text("version: 1\npolicies:\n"
                     "  strict: {tags: [flaky], platforms: [cpu]}\n"
                     "  lenient: {tags: [flaky], platforms: [cpu], allow_flaky: true}\n")
    report = str(runs.a / "report.xml")
    strict = run_cli("gate", "--policy", "strict", "--report", report, "--gates", str(gates))
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert "flaky" in strict.stdout + strict.stderr and FLAKY in strict.stdout + strict.stderr
    lenient = run_cli("gate", "--policy", "lenient", "--report", report, "--gates", str(gates))
    assert lenient.returncode == 0, lenient.stdout + lenient.stderr


@pytest.mark.parametrize(("extra", "message"), [
    (["--runs-per-test", "0"], "error: --runs-per-test must be >= 1, got 0"),
    (["--runs-per-test", "2", "--mutants"],
     "error: --runs-per-test N (N > 1) cannot be combined with --mutants"),
], ids=["zero", "mutants"])
def test_refused_options(tmp_path: Path, extra: list[str], message: str) -> None:
    proc = run_cli("run", "--matrix", str(MATRIX), "--out", str(tmp_path / "o"), *extra)
    assert proc.returncode == 2 and proc.stderr.startswith(message), proc.stderr


def test_dry_run_plans_every_run() -> None:
    proc = run_cli("run", "--matrix", str(MATRIX), "--runs-per-test", "3", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("plan: 3 cells x 3 runs in 1 worlds"), proc.stdout
    assert sum(ln.startswith(f"  {FLAKY}  ranks ") for ln in proc.stdout.splitlines()) == 3
