"""A PASS is tied to its sources all the way to the gate (issue 21, rows 6, 7 and 14):
real runs of ``resources/provenance_project`` through the CLI, then ``merge`` and ``gate``.

Four runs in a module fixture: ``a`` (every cell passes), ``s1`` (shard 1/2, the same
sources), ``b`` (``verdict.txt`` now says fail: same sources, another verdict), then the
module of ``steady`` is edited and ``s2`` (shard 2/2) runs from the new sources.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runner import RES, run_cli
from cpmatrix.report import read_report

pytestmark = pytest.mark.slow

STEADY = ["steady[unit,1x1,fp64,autocast=off,reference]@cpu",
          "steady[unit,1x2,fp64,autocast=off,reference]@cpu"]
VERDICT = "verdict[unit,1x1,fp64,autocast=off,reference]@cpu"


class Runs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.project = root / "project"
        self.matrix = self.project / "matrix.yaml"
        self.gates = self.project / "gates.yaml"

    def run(self, name: str, *extra: str) -> Path:
        out = self.root / name
        proc = run_cli("run", "--matrix", str(self.matrix), "--out", str(out), "--plain",
                       "--no-cache", *extra)
        assert proc.returncode in (0, 1), proc.stdout + proc.stderr
        return out

    def gate(self, report: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        return run_cli("gate", "--policy", "release", "--gates", str(self.gates), "--report",
                       str(report / "report.xml"), *extra)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    r = Runs(tmp_path_factory.mktemp("provenance"))
    shutil.copytree(RES / "provenance_project", r.project)
    r.run("a")
    r.run("s1", "--shard", "1/2")
    (r.project / "verdict.txt").write_text("fail\n")
    r.run("b")
    # Today's sources: steady's module changed (its cells' digests with it).
    steady = r.project / "cases" / "prov_steady.py"
    steady.write_text(steady.read_text().replace('"steady", 1', '"steady", 2'))
    r.run("s2", "--shard", "2/2")
    return r


def _statuses(folder: Path) -> dict[str, str]:
    return {c.cell_id: c.status.value for c in read_report(folder / "report.xml")}


def test_every_results_file_records_the_source(runs: Runs) -> None:
    a = runs.root / "a"
    run = json.loads((a / "run.json").read_text())
    source = run["source"]
    assert set(source) == {"matrix", "cpmatrix", "runtime", "commit", "cells"}
    assert re.fullmatch(r"[0-9a-f]{64}", source["matrix"])
    assert set(source["cells"]) == {VERDICT, *STEADY}
    rows = json.loads((a / "results.json").read_text())
    for row in rows:
        assert row["source"]["digest"] == source["cells"][row["cell_id"]]
        assert row["source"]["matrix"] == source["matrix"]
    for cell in read_report(a / "report.xml"):
        assert cell.properties["source.digest"] == source["cells"][cell.cell_id]
        assert cell.properties["source.cpmatrix"] == source["cpmatrix"]
    # A shard records the digests of the whole selection, not only its own cells.
    shard = json.loads((runs.root / "s1" / "run.json").read_text())["source"]
    assert shard["cells"] == source["cells"]


def test_every_result_names_the_machine_it_ran_on(runs: Runs) -> None:
    """Issue 30, row 6: the machine's identity (in the cache key) is in the report."""
    import torch

    from cpmatrix.cache.machine import cpu_flags

    a = runs.root / "a"
    cpu = json.loads((a / "run.json").read_text())["machine"]["cpu"]
    assert cpu == {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
                   "cpu_flags": cpu_flags(Path("/proc/cpuinfo").read_text())}
    line = f"cpu {cpu['cpu_capability']} ({cpu['cpu_flags']})"
    for row in json.loads((a / "results.json").read_text()):
        assert row["source"]["machine"] == line
    for cell in read_report(a / "report.xml"):
        assert cell.properties["source.machine"] == line
    shown = run_cli("show", VERDICT, "--matrix", str(runs.matrix), "--out", str(a))
    assert f"  machine: {line}" in shown.stdout, shown.stdout + shown.stderr


def test_two_folders_that_disagree_about_a_cell_fail_the_merge(runs: Runs) -> None:
    """Row 6: the first folder never wins; the conflict fails the merge."""
    a, b = runs.root / "a", runs.root / "b"
    assert _statuses(a)[VERDICT] == "passed" and _statuses(b)[VERDICT] == "failed"
    for first, second in ((a, b), (b, a)):
        out = runs.root / f"merged-{first.name}{second.name}"
        proc = run_cli("merge", str(first), str(second), "--out", str(out))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "1 cells were reported by more than one folder with different verdicts" \
            in proc.stderr and VERDICT in proc.stderr
        assert "1 conflicts" in proc.stdout
        cells = {c.cell_id: c for c in read_report(out / "report.xml")}
        assert cells[VERDICT].status.value == "failed"
        assert "conflict" in cells[VERDICT].properties["message"]
        assert all(cells[s].status.value == "passed" for s in STEADY)
        gate = runs.gate(out)
        assert gate.returncode == 1, gate.stdout + gate.stderr


def test_shards_from_different_sources_do_not_merge(runs: Runs) -> None:
    """Row 7 (merge): yesterday's shard 1 and today's shard 2 share no cell; the merge
    still sees their sources differ and names the cells whose digests differ."""
    s1, s2 = runs.root / "s1", runs.root / "s2"
    assert not set(_statuses(s1)) & set(_statuses(s2))
    proc = run_cli("merge", str(s1), str(s2), "--out", str(runs.root / "m12"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "ran different sources: 2 cells have different source digests" in proc.stderr
    for cell in STEADY:
        assert cell in proc.stderr
    assert VERDICT not in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_gate_fails_a_report_run_from_other_sources_as_stale(runs: Runs) -> None:
    """Row 7 (gate): ``a`` ran before steady's module changed: its steady cells are stale."""
    gate = runs.gate(runs.root / "a")
    assert gate.returncode == 1, gate.stdout + gate.stderr
    rows = [ln.split(None, 2) for ln in gate.stdout.splitlines()[1:-1]]
    assert sorted((check, cell) for check, cell, _ in rows) == [("stale", c) for c in STEADY]
    assert "FAIL  gate 'release': 2 reasons (2 stale)" in gate.stdout
    # Today's shard 2 ran from today's sources: none of its cells is stale.
    s2 = runs.gate(runs.root / "s2")
    assert "stale" not in s2.stdout, s2.stdout
    # Without a matrix nothing says which sources are today's, and the gate says so.
    unchecked = run_cli("gate", "--policy", "unchecked", "--gates", str(runs.gates),
                        "--report", str(runs.root / "a" / "report.xml"))
    assert unchecked.returncode == 0, unchecked.stdout + unchecked.stderr
    assert "sources   not checked" in unchecked.stdout
    # --matrix gives one.
    given = run_cli("gate", "--policy", "unchecked", "--gates", str(runs.gates), "--matrix",
                    str(runs.matrix), "--report", str(runs.root / "a" / "report.xml"))
    assert given.returncode == 1 and given.stdout.count("stale ") == 2, given.stdout


def test_reports_and_folders_without_sources_are_refused(runs: Runs) -> None:
    old = runs.root / "old"
    shutil.copytree(runs.root / "s2", old)
    report = old / "report.xml"
    report.write_text(re.sub(r'<property name="source\.[a-z]+" value="[^"]*"\s*/>', "",
                             report.read_text()))
    gate = runs.gate(old)
    assert gate.returncode == 2, gate.stdout + gate.stderr
    assert "no cell carries a source digest" in gate.stderr and "Traceback" not in gate.stderr
    rows = json.loads((old / "results.json").read_text())
    (old / "results.json").write_text(json.dumps([{k: v for k, v in r.items() if k != "source"}
                                                  for r in rows]))
    (old / "run.json").unlink()
    proc = run_cli("merge", str(old), "--out", str(runs.root / "m-old"))
    assert proc.returncode == 2 and "carry no source digest" in proc.stderr, proc.stderr


def test_a_relative_python_is_resolved_once_and_a_bad_one_is_exit_2(tmp_path: Path) -> None:
    """Row 14: ``--python ./venv/bin/python`` names the same file in the world's folder."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(tmp_path / "venv")], check=True, timeout=120)
    matrix = str(RES / "provenance_project" / "matrix.yaml")
    proc = run_cli("run", "--matrix", matrix, "-k", "steady and 1x1", "--out", "out",
                   "--plain", "--no-cache", "--python", "./venv/bin/python", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    toolchain = json.loads((tmp_path / "out" / "run.json").read_text())["toolchain"]
    assert toolchain["interpreter"].startswith("sha256:")  # probed through the resolved path
    command = json.loads(next((tmp_path / "out" / "worlds").glob("*/command.json"))
                         .read_text())["argv"]
    assert str(tmp_path / "venv" / "bin" / "python") in command
    for bad, why in (("./nope/python", "no such interpreter"),
                     ("no-such-python-anywhere", "no such interpreter (not found on PATH)")):
        proc = run_cli("run", "--matrix", matrix, "--out", "out2", "--python", bad,
                       cwd=tmp_path)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"--python {bad}: {why}" in proc.stderr and "Traceback" not in proc.stderr
