"""`cpmatrix run` end to end on real gloo worlds: report, evidence, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from junitparser import JUnitXml

from cpmatrix.junit import read_junit_results

RES = Path(__file__).parent / "resources"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cpmatrix", *args], capture_output=True,
                          text=True, timeout=600, check=False, env=env)


@pytest.mark.slow
def test_green_run_writes_a_complete_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "CPMATRIX_TEST_SECRET": "hunter2"}
    proc = cli("run", "--matrix", str(RES / "runtime.yaml"), "--out", str(out), "--plain", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Plain progress: one line per cell, a summary last.
    lines = proc.stdout.splitlines()
    assert lines[0] == "runner: local (chosen with --runner)"
    assert lines[1] == "running 4 cells"
    assert sum(1 for ln in lines if ln.startswith("[") and "PASSED" in ln) == 4
    assert "==== 4 cells: 4 passed" in proc.stdout
    # The report: valid JUnit, one suite per target, each cell once, properties.
    xml = JUnitXml.fromfile(str(out / "report.xml"))
    assert sorted(s.name for s in xml) == ["allreduce", "evidence"]
    cases = read_junit_results(out / "report.xml")
    assert len(cases) == 4 and len({c["name"] for c in cases}) == 4
    ev = next(c for c in cases if c["name"].startswith("evidence"))["properties"]
    for key in ("cell_id", "digest", "platform", "mesh", "world_size", "dtype", "autocast",
                "path", "level", "params", "duration", "status"):
        assert key in ev, key
    assert ev["status"] == "passed" and ev["mesh"] == "1x2" and ev["world_size"] == "2"
    assert ev["evidence.mesh_shape"] == "1x2"
    assert ev["evidence.dim_names"] == "cp0,cp1"
    assert ev["evidence.tz"] == "UTC"
    assert ev["evidence.secret_visible"] == "False", "secrets must not reach a cell"
    assert ev["evidence.home_private"] == "True"
    assert ev["evidence.rank"] == "0" and ev["evidence.rank@rank1"] == "1"
    assert "hunter2" not in (out / "report.xml").read_text()
    # Same seed and generator draws on every rank (they agreed: one property, no @rank1).
    assert "evidence.draw@rank1" not in ev
    assert (out / "cells" / ev["cell_id"] / "rank1" / "note.txt").is_file()
    verify = subprocess.run(["junitparser", "verify", str(out / "report.xml")],
                            capture_output=True, text=True, check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # Durations are kept beside the results for the next plan.
    durations = json.loads((out / "durations.json").read_text())
    assert set(durations) == {c["name"] for c in cases}


def test_nothing_selected_exits_3(tmp_path: Path) -> None:
    proc = cli("run", "--matrix", str(RES / "runtime.yaml"), "-k", "nosuchthing",
               "--out", str(tmp_path))
    assert proc.returncode == 3
    assert "nothing selected" in proc.stderr and "nosuchthing" in proc.stderr


def test_cuda_without_device_exits_2_but_dry_run_plans(tmp_path: Path) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = cli("run", "--matrix", str(RES / "runtime.yaml"), "--platform", "cuda",
               "--out", str(tmp_path), env=env)
    assert proc.returncode == 2
    assert "no CUDA device is visible" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = cli("run", "--matrix", str(RES / "runtime.yaml"), "--platform", "cuda", "--dry-run",
               "--out", str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stderr
    assert "plan: 4 cells in 3 worlds" in proc.stdout
    assert "world cuda-w4-b0: 4 ranks, 1 cells" in proc.stdout


@pytest.mark.parametrize("bad", [["--batch-size", "0"], ["--jobs", "0"], ["--runner", "ssh"]])
def test_bad_run_options_exit_2(bad: list[str], tmp_path: Path) -> None:
    proc = cli("run", "--matrix", str(RES / "runtime.yaml"), "--out", str(tmp_path), *bad)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_jobs_run_worlds_concurrently_with_the_same_results(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = cli("run", "--matrix", str(RES / "runtime.yaml"), "--out", str(out), "--jobs", "3",
               "--plain", "--no-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert sorted(r["status"] for r in results) == ["passed"] * 4
    # All three worlds (1, 2 and 4 ranks) were launched before any of them finished.
    launched, finished = [], []
    for world in (out / "worlds").glob("*.a*"):
        launched.append((world / "command.json").stat().st_mtime)
        finished.append(max(json.loads(p.read_text())["end_time"]
                            for p in (world / "progress").glob("*.done")))
    assert len(launched) == 3
    assert max(launched) < min(finished), (launched, finished)


@pytest.mark.slow
def test_a_platform_without_image_runs_locally_and_refuses_docker(tmp_path: Path) -> None:
    matrix = str(RES / "no_image.yaml")
    where = f"{matrix}:6"  # the platform's line
    # --runner docker: exit 2 before anything starts, naming the platform and the file
    proc = cli("run", "--matrix", matrix, "--runner", "docker", "--out", str(tmp_path / "d"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"--runner docker: platform 'cpu' declares no image ({where})" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "d" / "worlds").exists()
    # --runner local: a real 2-rank world runs the cell
    proc = cli("run", "--matrix", matrix, "--runner", "local", "--out", str(tmp_path / "l"),
               "--plain", "--no-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 cells: 1 passed" in proc.stdout
    # --runner auto: docker is skipped with the reason, whatever this machine has
    proc = cli("run", "--matrix", matrix, "--runner", "auto", "--out", str(tmp_path / "a"),
               "--plain", "--no-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runner_line = proc.stdout.splitlines()[0]
    assert runner_line.startswith("runner: ") and not runner_line.startswith("runner: docker")
    assert f"docker: platform 'cpu' declares no image ({where})" in runner_line
    assert "1 cells: 1 passed" in proc.stdout
