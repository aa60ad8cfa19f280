"""``cpmatrix run --scheduler slurm`` against the real one-node Slurm of ``.ci/slurm-up``.

Every check compares with what the same selection does on this host, or with what Slurm
itself says (squeue): the verdicts and fp64 evidence of a Slurm run equal the local
run's; faults are attributed to the same cell, kind and rank; a job cancelled with
``scancel`` blames none of the cells it held (they run again in a new job, and end
``infra`` when that keeps happening); Ctrl-C
cancels every job of the run and writes the partial report; a job PENDING past the limit
fails its cells saying so; no Slurm client on PATH is a usage error.

Skipped only where ``sinfo`` is absent and ``CPMATRIX_REQUIRE_SLURM`` is unset (``.ci/run``
sets it after ``bash .ci/slurm-up``, so CI cannot skip these silently).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cli_runner import RES, processes_with, run_cli, start_cli, stop, wait_for
from cpmatrix.worker.protocol import parse_marker_name

REPO = Path(__file__).resolve().parents[2]

if shutil.which("sinfo") is None:
    if os.environ.get("CPMATRIX_REQUIRE_SLURM"):
        raise RuntimeError("CPMATRIX_REQUIRE_SLURM is set but sinfo is not on PATH: "
                           "run `bash .ci/slurm-up` first")
    pytest.skip("no Slurm here (bash .ci/slurm-up starts one; CI requires it)",
                allow_module_level=True)


def _results(out: Path) -> dict[str, dict[str, Any]]:
    return {r["cell_id"]: r for r in json.loads((out / "results.json").read_text())}


def _verdict(r: dict[str, Any]) -> tuple[Any, ...]:
    """What must not depend on where a world ran (not durations, not log text)."""
    return (r["status"], r["kind"], r["failing_ranks"], r["attempts"], r["evidence"])


def _jobs_of(out: Path) -> list[tuple[str, str]]:
    """(job id, state) of every Slurm job this run's out folder names (its run id)."""
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    proc = subprocess.run(["squeue", "--noheader", "--states=all", "--format=%j|%i|%T"],
                          capture_output=True, text=True, check=True)
    rows = [line.split("|") for line in proc.stdout.split()]
    return [(job_id, state) for name, job_id, state in rows
            if name.startswith(f"cpmatrix-{run_id}-")]


def _started(out: Path, index: int) -> bool:
    """Some rank wrote the start marker of cell ``index`` of a world of this run."""
    for marker in out.glob("worlds/*/progress/*"):
        parsed = parse_marker_name(marker.name)
        if parsed is not None and parsed[0] == index and parsed[2] == "start":
            return True
    return False


def _run(matrix: str, out: Path, *args: str, slurm: bool) -> subprocess.CompletedProcess[str]:
    extra = ("--scheduler", "slurm", "--max-jobs", "2") if slurm else ()
    return run_cli("run", "--matrix", matrix, "--out", str(out), "--plain", "--no-cache",
                   *args, *extra)


def test_slurm_verdicts_and_fp64_evidence_equal_the_local_run(tmp_path: Path) -> None:
    # Two world sizes: five 2-rank fp64 parity cells and a 9-rank cell (more ranks than
    # the node's 2 CPUs: one task per world, the launcher inside, see docs/scale.md), in
    # one 9-rank world (seconds of work: one job; the 2-rank cells run in a group of 2).
    sel = ("-k", "fp64 and reference and ((n=5 and 1x2 and not pair_block) "
           "or (ring_attention and 3x3))")
    matrix = str(REPO / "matrix" / "parity.yaml")
    local = _run(matrix, tmp_path / "local", *sel, slurm=False)
    assert local.returncode == 0, local.stdout + local.stderr
    slurm = _run(matrix, tmp_path / "slurm", *sel, slurm=True)
    assert slurm.returncode == 0, slurm.stdout + slurm.stderr
    assert "scheduler: slurm" in slurm.stdout
    want, got = _results(tmp_path / "local"), _results(tmp_path / "slurm")
    assert len(want) == 6 and got.keys() == want.keys()
    for cell_id, r in want.items():
        assert _verdict(got[cell_id]) == _verdict(r), cell_id
    assert all(any(k.endswith(".max_abs") and isinstance(v, float)
                   for k, v in r["evidence"].items()) for r in want.values()), \
        "every cell's fp64 error evidence was compared"
    # The world ran as a Slurm job of this run, and it completed.
    jobs = _jobs_of(tmp_path / "slurm")
    assert len(jobs) == 1 and {state for _, state in jobs} == {"COMPLETED"}, jobs


def test_faults_are_attributed_exactly_as_locally(tmp_path: Path) -> None:
    # Three faults, each in the middle of three cells of one 1x2 world (faults.yaml).
    sel = ("-k", "(fault=sigkill or fault=raise_rank1 or fault=hang_collective) "
           "and (pos=2 or pos=3 or pos=4)", "--keep-order", "--abort-grace", "2")
    matrix = str(RES / "faults.yaml")
    local = _run(matrix, tmp_path / "local", *sel, slurm=False)
    assert local.returncode == 1, local.stdout + local.stderr
    slurm = _run(matrix, tmp_path / "slurm", *sel, slurm=True)
    assert slurm.returncode == 1, slurm.stdout + slurm.stderr
    want, got = _results(tmp_path / "local"), _results(tmp_path / "slurm")
    assert len(want) == 9 and got.keys() == want.keys()
    for cell_id, r in want.items():
        assert _verdict(got[cell_id]) == _verdict(r), (cell_id, got[cell_id], r)
        assert (r["status"] == "passed") == ("pos=3" not in cell_id), (cell_id, r)
    by_fault = {cid.split("fault=")[1].split(",")[0]: r for cid, r in got.items()
                if "pos=3" in cid}
    assert (by_fault["sigkill"]["status"], by_fault["sigkill"]["failing_ranks"]) == \
        ("crash", [1])
    assert (by_fault["raise_rank1"]["status"], by_fault["raise_rank1"]["failing_ranks"]) == \
        ("failed", [1])
    assert by_fault["hang_collective"]["status"] == "timeout"


def _both_started(out: Path) -> bool:
    """Both cells of the pair are in flight in the newest job (each rank 0 started)."""
    worlds = sorted(out.glob("worlds/*/progress"))
    return bool(worlds) and len(list(worlds[-1].glob("*.r0.start"))) == 2


def _cancel_when_both_run(out: Path, times: int) -> list[str]:
    """scancel each new job of the run once both cells run in it, ``times`` times."""
    cancelled: list[str] = []
    while len(cancelled) < times:
        wait_for("a new job with both cells in flight", lambda: _both_started(out) and any(
            state == "RUNNING" and job not in cancelled for job, state in _jobs_of(out)),
            timeout=180)
        (job,) = [j for j, state in _jobs_of(out) if state == "RUNNING" and j not in cancelled]
        subprocess.run(["scancel", job], check=True)
        cancelled.append(job)
        wait_for("the cancelled job to read CANCELLED",
                 lambda j=job: dict(_jobs_of(out))[j] == "CANCELLED", timeout=60)
    return cancelled


def test_a_job_ended_from_outside_blames_none_of_its_cells(tmp_path: Path) -> None:
    """Row 13 of issue 21: two cells side by side, the job cancelled from outside. Before,
    the earliest cell was blamed (a crash, then flaky: the gate refused it); now neither
    is, and both run again in a new job and pass at their first attempt."""
    out = tmp_path / "out"
    proc = start_cli("run", "--matrix", str(RES / "slurm_pair.yaml"), "--out", str(out),
                     "--plain", "--no-cache", "--world-ranks", "4", "--scheduler", "slurm",
                     log=tmp_path / "log")
    (job,) = _cancel_when_both_run(out, 1)
    assert proc.wait(timeout=300) == 0, (tmp_path / "log").read_text()
    for r in _results(out).values():
        assert (r["status"], r["attempts"], r["kind"]) == ("passed", 1, None), r
    jobs = dict(_jobs_of(out))
    assert jobs[job] == "CANCELLED" and len(jobs) == 2, jobs
    assert sorted(jobs.values()) == ["CANCELLED", "COMPLETED"], jobs


def test_cells_whose_jobs_keep_being_ended_have_no_verdict_and_fail_the_gate(
        tmp_path: Path) -> None:
    """Ended from outside three times (LOST_RETRIES = 2): ``infra``, not crash, failed or
    flaky; a report holding it fails every gate policy."""
    out = tmp_path / "out"
    proc = start_cli("run", "--matrix", str(RES / "slurm_pair.yaml"), "--out", str(out),
                     "--plain", "--no-cache", "--world-ranks", "4", "--scheduler", "slurm",
                     log=tmp_path / "log")
    cancelled = _cancel_when_both_run(out, 3)
    assert proc.wait(timeout=300) == 1, (tmp_path / "log").read_text()
    for r in _results(out).values():
        assert r["status"] == "infra" and r["kind"] is None and r["failures"] == [], r
        assert "ended from outside 3 times" in r["message"]
        assert f"Slurm ended job {cancelled[-1]} (CANCELLED" in r["message"], r["message"]
    assert "2 infra" in (tmp_path / "log").read_text()
    gates = tmp_path / "gates.yaml"
    gates.write_text("version: 1\npolicies:\n  all: {allow_flaky: true, allow_skipped: true}\n")
    gate = run_cli("gate", "--policy", "all", "--gates", str(gates), "--report",
                   str(out / "report.xml"))
    assert gate.returncode == 1 and "infra" in gate.stdout + gate.stderr, gate.stdout


def test_ctrl_c_cancels_every_job_and_writes_the_partial_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = start_cli("run", "--matrix", str(RES / "slurm.yaml"), "--out", str(out),
                     "--plain", "--no-cache", "--keep-order", "--scheduler", "slurm",
                     log=tmp_path / "log")
    wait_for("the sleeper cell to start, the first one reported",
             lambda: _started(out, 1) and "PASSED" in (tmp_path / "log").read_text(),
             timeout=180)
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    assert stop(proc, signal.SIGINT) == 130, (tmp_path / "log").read_text()
    results = {cid.split("[")[0]: r["status"] for cid, r in _results(out).items()}
    assert results == {"q0_quick": "passed", "q1_sleeper": "interrupted",
                       "q2_quick": "interrupted"}
    assert not processes_with(run_id), "nothing of the run outlives it"
    # The job was cancelled by cpmatrix (it may take Slurm's KillWait to read so).
    wait_for("the job to end CANCELLED",
             lambda: {state for _, state in _jobs_of(out)} == {"CANCELLED"}, timeout=30)


def test_a_job_pending_past_the_limit_fails_its_cells_saying_so(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _run(str(RES / "slurm.yaml"), out, "-k", "quick", "--pending-timeout", "3",
                "--slurm-arg=--begin=now+3600", slurm=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for r in _results(out).values():
        assert r["status"] == "crash" and "was still PENDING after" in r["message"], r
        assert "BeginTime" in r["message"] and r["attempts"] == 1
    [(_, state)] = _jobs_of(out)
    assert state == "CANCELLED"


def test_no_slurm_client_on_path_is_a_usage_error(tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    proc = run_cli("run", "--matrix", str(RES / "runtime.yaml"), "--scheduler", "slurm",
                   "--out", str(tmp_path / "out"), env={"PATH": str(bare)})
    assert proc.returncode == 2 and "needs srun, squeue, scancel on PATH" in proc.stderr, \
        proc.stderr
    assert "Traceback" not in proc.stderr
    # Slurm flags without the Slurm scheduler are a usage error too.
    proc = run_cli("run", "--matrix", str(RES / "runtime.yaml"), "--partition", "x",
                   "--out", str(tmp_path / "o2"))
    assert proc.returncode == 2 and "need --scheduler slurm" in proc.stderr, proc.stderr


@pytest.mark.parametrize("runner", ["sandbox", pytest.param("docker", marks=pytest.mark.docker)])
def test_the_runs_runner_isolates_the_world_inside_the_job(tmp_path: Path, runner: str) -> None:
    # The runner's command is the job's one task: bwrap / docker run inside srun.
    out = tmp_path / "out"
    proc = _run(str(RES / "signals.yaml"), out, "-k", "s0_quick or s1_quick",
                "--runner", runner, slurm=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {r["status"] for r in _results(out).values()} == {"passed"}
    [command] = [json.loads(p.read_text())["argv"] for p in out.glob("worlds/*/command.json")]
    isolation = [shutil.which("bwrap")] if runner == "sandbox" else [shutil.which("docker"), "run"]
    assert command[0] == "srun" and command[6:6 + len(isolation)] == isolation, command[:8]
    [(_, state)] = _jobs_of(out)
    assert state == "COMPLETED"
