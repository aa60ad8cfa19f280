"""`cpmatrix run` end to end on real gloo worlds: report, evidence, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from junitparser import JUnitXml

from cli_runner import run_cli as cli
from cpmatrix.report import read_report

RES = Path(__file__).parents[1] / "resources"


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
    cases = read_report(out / "report.xml")
    assert len(cases) == 4 and len({c.name for c in cases}) == 4
    ev = next(c for c in cases if c.name.startswith("evidence")).properties
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
    assert set(durations) == {c.name for c in cases}


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
    assert "plan: 4 cells in 1 worlds" in proc.stdout  # one world per platform
    assert "world cuda-w4-b0: 4 ranks, 4 cells" in proc.stdout


CUDA_IDS = {
    "1x1": "allreduce[unit,1x1,fp64,autocast=off,reference]@cuda",
    "1x2": "allreduce[unit,1x2,fp64,autocast=off,reference]@cuda",
    "2x2": "allreduce[unit,2x2,fp64,autocast=off,reference]@cuda",
    "ev": "evidence[unit,1x2,fp64,autocast=off,reference]@cuda",
}


@pytest.mark.parametrize(
    ("gpus", "planned", "skipped"),
    [
        ("1", ["1x1"], {"1x2": 2, "2x2": 4, "ev": 2}),
        ("2", ["1x2", "ev", "1x1"], {"2x2": 4}),
        ("4", ["2x2", "1x2", "ev", "1x1"], {}),
    ],
)
def test_gpus_plans_the_cuda_cells_that_fit_and_skips_the_rest(
    gpus: str, planned: list[str], skipped: dict[str, int], tmp_path: Path,
) -> None:
    proc = cli("run", "--matrix", str(RES / "runtime.yaml"), "--platform", "cuda",
               "--gpus", gpus, "--dry-run", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    cut = next((i for i, ln in enumerate(lines) if ln.startswith("skipped")), len(lines))
    in_plan = [ln.split()[0] for ln in lines[:cut] if ln.startswith("  ") and "timeout=" in ln]
    assert in_plan == [CUDA_IDS[k] for k in planned]
    assert lines[0].startswith(f"plan: {len(planned)} cells")
    left = {ln.split()[0]: ln.split(None, 1)[1] for ln in lines[cut + 1:]}
    assert left == {CUDA_IDS[k]: f"needs {n} GPUs (one per rank); {gpus} visible"
                    for k, n in skipped.items()}
    if skipped:
        assert lines[cut] == (f"skipped (not run on this host, reported as skipped): "
                              f"{len(skipped)} cells")


def test_no_cuda_cell_fits_every_cell_is_reported_skipped_and_exits_3(tmp_path: Path) -> None:
    """A one-GPU host and only multi-rank cuda cells: nothing launched, a report of skips,
    exit 3, and the release gate fails on the skips unless its policy allows them."""
    out = tmp_path / "out"
    proc = cli("run", "--matrix", str(RES / "runtime.yaml"), "--platform", "cuda", "--gpus", "1",
               "-k", "not 1x1", "--out", str(out), "--plain")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "nothing to run: each of the 3 selected cells needs more GPUs than the 1 visible" \
        in proc.stderr
    assert "==== 3 cells: 3 skipped" in proc.stdout
    assert "2 cells not run: needs 2 GPUs (one per rank); 1 visible" in proc.stdout
    # Nothing was launched: no world folder, only the merged report's part for the skips.
    assert sorted(p.name for p in (out / "worlds").iterdir()) == ["skipped.junit.xml"]
    cases = {c.name: c for c in read_report(out / "report.xml")}
    assert set(cases) == {CUDA_IDS[k] for k in ("1x2", "2x2", "ev")}
    big = cases[CUDA_IDS["2x2"]]
    assert big.properties["status"] == "skipped"
    assert big.properties["world_size"] == "4"
    xml = (out / "report.xml").read_text()
    assert 'message="not run: needs 4 GPUs (one per rank); 1 visible"' in xml
    results = json.loads((out / "results.json").read_text())
    assert [r["status"] for r in results] == ["skipped"] * 3
    policies = tmp_path / "gates.yaml"
    policies.write_text("version: 1\npolicies:\n"
                        "  gpu: {description: cuda cells, platforms: [cuda]}\n"
                        "  gpu-lenient: {description: skips allowed, platforms: [cuda], "
                        "allow_skipped: true}\n")
    gate = cli("gate", "--gates", str(policies), "--policy", "gpu", "--report",
               str(out / "report.xml"))
    assert gate.returncode == 1, gate.stdout + gate.stderr
    assert "not run: needs 4 GPUs (one per rank); 1 visible" in gate.stdout
    assert "3 skipped" in gate.stdout
    lenient = cli("gate", "--gates", str(policies), "--policy", "gpu-lenient", "--report",
                  str(out / "report.xml"))
    assert lenient.returncode == 0, lenient.stdout + lenient.stderr


def test_gpus_must_not_be_negative(tmp_path: Path) -> None:
    proc = cli("run", "--matrix", str(RES / "runtime.yaml"), "--platform", "cuda",
               "--gpus", "-1", "--dry-run", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert "--gpus must be >= 0, got -1" in proc.stderr


@pytest.mark.parametrize("bad", [["--batch-size", "0"], ["--jobs", "0"], ["--runner", "ssh"],
                                 ["--pack", "greedy"], ["--world-ranks", "0"],
                                 ["--world-ranks", "65"]])
def test_bad_run_options_exit_2(bad: list[str], tmp_path: Path) -> None:
    proc = cli("run", "--matrix", str(RES / "runtime.yaml"), "--out", str(tmp_path), *bad)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_jobs_run_worlds_concurrently_with_the_same_results(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # --jobs 3: the platform's 4 cells split into 3 balanced worlds that run at once
    # (without it they share one world).
    proc = cli("run", "--matrix", str(RES / "runtime.yaml"), "--out", str(out), "--jobs", "3",
               "--plain", "--no-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert sorted(r["status"] for r in results) == ["passed"] * 4
    # All three worlds were launched before any of them finished.
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
