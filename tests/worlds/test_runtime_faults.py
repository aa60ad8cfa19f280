"""Faults in real torchrun worlds (gloo, 1x2): exactly the faulty cell fails, rightly.

Each run puts the fault first, in the middle and last of a batch of 7 cells
(`tests/resources/faults.yaml`, run with --keep-order). Every other cell must report
its true result, the merged report must hold each planned cell exactly once, and the
run must end within the timeouts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from junitparser import JUnitXml

from cli_runner import run_cli as cli

RES = Path(__file__).parents[1] / "resources"
FAULTY = (0, 3, 6)

# fault -> (status, kind, failing ranks, text that must be in the failing rank's evidence)
EXPECT = {
    "raise_all": ("failed", "error", [0, 1], "planted failure on rank 1"),
    "raise_rank1": ("failed", "error", [1], "planted failure on rank 1 only"),
    "exit13": ("crash", "crash", [1], "exited with code 13"),
    "sigkill": ("crash", "crash", [1], "SIGKILL"),
    "hang_collective": ("timeout", "timeout", [0], "all_reduce"),
    "spin": ("timeout", "timeout", [0, 1], "in faulty"),
    "nan": ("failed", "error", [0, 1], "output has NaN"),
}


def run_cli(*args: str, timeout: float = 300) -> tuple[int, str, float]:
    t0 = time.monotonic()
    proc = cli(*args, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0


def check_report(out: Path, expected_ids: list[str]) -> dict[str, dict]:
    """The merged report holds each planned cell exactly once; returns results by id."""
    xml = JUnitXml.fromfile(str(out / "report.xml"))
    names = [case.name for suite in xml for case in suite]
    assert sorted(names) == sorted(expected_ids), "each planned cell exactly once"
    results = json.loads((out / "results.json").read_text())
    return {r["cell_id"]: r for r in results}


@pytest.mark.slow
@pytest.mark.parametrize("fault", sorted(EXPECT))
def test_fault_is_attributed_to_exactly_its_cell(fault: str, tmp_path: Path) -> None:
    status, kind, ranks, text = EXPECT[fault]
    ids = [f"seq[unit,1x2,fp64,autocast=off,reference,fault={fault},pos={p}]@cpu"
           for p in range(7)]
    rc, output, wall = run_cli(
        "run", "--matrix", str(RES / "faults.yaml"), "-k", f"fault={fault}", "--keep-order",
        "--abort-grace", "2", "--out", str(tmp_path / "out"), "--plain",
    )
    assert rc == 1, output
    by_id = check_report(tmp_path / "out", ids)
    for pos, cid in enumerate(ids):
        r = by_id[cid]
        if pos not in FAULTY:
            assert r["status"] == "passed", (cid, r)
            assert r["evidence"]["max_abs_err"] == 0.0
            continue
        assert (r["status"], r["kind"]) == (status, kind), (cid, r)
        assert r["failing_ranks"] == ranks, (cid, r)
        blob = "\n".join(f["message"] + "\n" + f["traceback"] for f in r["failures"])
        assert text in blob, (cid, blob[:2000])
        if kind == "crash":
            assert r["attempts"] == 2, "a crashed cell is retried once alone"
        # The summary names the cell, its kind and rank.
        assert f"{status.upper()} {cid}" in output
    # Not a speed check: the run must end (no hang). 3 faults x (6 s timeout + restart +
    # retry) fit many times over in this bound even on a loaded 2-core machine.
    assert wall < 400, f"run took {wall:.0f} s: something waited past the timeouts"


@pytest.mark.slow
def test_unimportable_case_module_fails_only_its_cells(tmp_path: Path) -> None:
    rc, output, _ = run_cli("run", "--matrix", str(RES / "faults_import.yaml"), "--keep-order",
                            "--out", str(tmp_path / "out"), "--plain")
    assert rc == 1, output
    ids = [f"p{i}_{'broken' if i in FAULTY else 'good'}[unit,1x2,fp64,autocast=off,reference]@cpu"
           for i in range(7)]
    by_id = check_report(tmp_path / "out", ids)
    for i, cid in enumerate(ids):
        r = by_id[cid]
        if i in FAULTY:
            assert (r["status"], r["kind"], r["failing_ranks"]) == ("failed", "error", [0, 1])
            assert "planted: this module cannot be imported" in r["failures"][0]["traceback"]
        else:
            assert r["status"] == "passed", r
    # An import error is an ordinary failure: no world restart was needed.
    assert len(list((tmp_path / "out" / "worlds").glob("*.a*"))) == 1


@pytest.mark.slow
def test_launcher_without_torch_fails_cells_with_the_error(tmp_path: Path) -> None:
    """An OS-level problem (here: the interpreter has no torch, so no torchrun) fails
    the affected cells with the launcher's error; the run does not die silently."""
    # A bare venv of this interpreter: no site-packages, so no torch (and no torchrun).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")],
                   check=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    check = subprocess.run([python, "-c", "import torch"], capture_output=True, check=False)
    assert check.returncode != 0, "the bare venv must not see torch"
    rc, output, _ = run_cli("run", "--matrix", str(RES / "faults.yaml"), "-k",
                            "fault=none and (pos=0 or pos=1)", "--python", python,
                            "--out", str(tmp_path / "out"), "--plain")
    assert rc == 1, output
    ids = [f"seq[unit,1x2,fp64,autocast=off,reference,fault=none,pos={p}]@cpu" for p in (0, 1)]
    by_id = check_report(tmp_path / "out", ids)
    for cid in ids:
        r = by_id[cid]
        assert r["status"] == "crash"
        assert "could not start a world" in r["message"]
        assert "No module named" in r["stderr_tails"]["-1"]
    assert "could not start a world" in output


@pytest.mark.slow
def test_a_cell_finishing_during_its_timeout_handling_gets_one_result(tmp_path: Path) -> None:
    """Regression: the cell completed while its stacks were being dumped and was reported
    twice (PASSED, then TIMEOUT). Each planned cell must end as exactly one result."""
    rc, output, _ = run_cli("run", "--matrix", str(RES / "race.yaml"), "--keep-order",
                            "--out", str(tmp_path / "out"), "--plain", "--no-cache")
    ids = ["a_sleepy[unit,1x2,fp64,autocast=off,reference,secs=2.6]@cpu",
           "b_after[unit,1x2,fp64,autocast=off,reference]@cpu"]
    by_id = check_report(tmp_path / "out", ids)
    assert len(json.loads((tmp_path / "out" / "results.json").read_text())) == 2
    assert output.count(ids[0]) == 1 + (rc == 1), output  # progress line (+ failure block)
    assert by_id[ids[0]]["status"] in ("passed", "timeout")
    assert by_id[ids[1]]["status"] == "passed"
    assert "second result" not in output
