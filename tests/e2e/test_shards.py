"""``run --shard K/N`` + ``merge`` + ``gate``: real worlds, the CLI as a CI job runs it."""

from __future__ import annotations

import json
from pathlib import Path

from cli_runner import RES, run_cli
from cpmatrix.report import read_report

MATRIX = str(RES / "runtime.yaml")
GATES = str(RES / "gates" / "policies.yaml")


def _shard(k: int, n: int, out: Path, *extra: str) -> None:
    proc = run_cli("run", "--matrix", MATRIX, "--shard", f"{k}/{n}", "--out", str(out),
                   "--plain", "--no-cache", *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"shard {k}/{n}: " in proc.stdout


def test_shards_merge_into_the_unsharded_report_and_pass_the_gate(tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    proc = run_cli("run", "--matrix", MATRIX, "--out", str(whole), "--plain", "--no-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shards = [tmp_path / f"s{k}" for k in (1, 2)]
    for k, out in enumerate(shards, 1):
        # The last release's durations balance the shards (the CI templates pass them).
        _shard(k, 2, out, "--durations-from", str(whole / "durations.json"))
    owned = [json.loads((s / "shard.json").read_text())["partition"][k]
             for k, s in enumerate(shards)]
    assert [sorted(r["cell_id"] for r in json.loads((s / "results.json").read_text()))
            for s in shards] == [sorted(o) for o in owned], "each shard ran its own cells"
    assert sorted(c for o in owned for c in o) == sorted(c.cell_id for c in read_report(
        whole / "report.xml")), "every cell in exactly one shard"
    merged = tmp_path / "merged"
    proc = run_cli("merge", *map(str, shards), "--out", str(merged))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 missing" in proc.stdout
    got = {c.name: c for c in read_report(merged / "report.xml")}
    want = {c.name: c for c in read_report(whole / "report.xml")}
    assert got.keys() == want.keys()
    for name, cell in want.items():
        assert got[name].status == cell.status, name
        assert got[name].evidence == cell.evidence, name
    gate = run_cli("gate", "--policy", "runtime", "--gates", GATES,
                   "--report", str(merged / "report.xml"),
                   "--baseline", str(whole / "report.xml"))
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert (merged / "report.html").is_file()

    # A shard whose job died (its folder never made it): its cells are reported missing,
    # never dropped, and the gate refuses the release.
    partial = tmp_path / "partial"
    proc = run_cli("merge", str(shards[0]), "--out", str(partial))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lost = owned[1]
    assert lost and f"{len(lost)} missing" in proc.stdout
    cells = {c.cell_id: c for c in read_report(partial / "report.xml")}
    assert set(cells) == {c.split("!")[0] for c in want}
    for cell_id in lost:
        assert cells[cell_id].status.value == "interrupted"
        assert "belongs to shard 2/2" in cells[cell_id].properties["message"]
    gate = run_cli("gate", "--policy", "runtime", "--gates", GATES,
                   "--report", str(partial / "report.xml"))
    assert gate.returncode == 1, gate.stdout + gate.stderr


def test_more_shards_than_cells_leave_empty_reports_that_merge(tmp_path: Path) -> None:
    outs = [tmp_path / f"s{k}" for k in range(1, 4)]
    for k, out in enumerate(outs, 1):
        _shard(k, 3, out, "-k", "evidence and cpu")
    assert sum(bool(json.loads((o / "results.json").read_text())) for o in outs) == 1
    merged = tmp_path / "merged"
    proc = run_cli("merge", *map(str, outs), "--out", str(merged))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(read_report(merged / "report.xml")) == 1


def test_bad_shard_and_merge_input_exit_2(tmp_path: Path) -> None:
    for bad in ("3/2", "x", "0/1"):
        proc = run_cli("run", "--matrix", MATRIX, "--shard", bad, "--out", str(tmp_path / "o"))
        assert proc.returncode == 2 and "--shard" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    proc = run_cli("merge", str(tmp_path / "nope"), "--out", str(tmp_path / "m"))
    assert proc.returncode == 2 and "no such folder" in proc.stderr, proc.stderr
    one, two = tmp_path / "a", tmp_path / "b"
    for folder, n in ((one, 2), (two, 3)):
        folder.mkdir()
        (folder / "shard.json").write_text(json.dumps(
            {"shard": 1, "of": n, "selection": f"sel{n}", "partition": [[]] * n}))
    proc = run_cli("merge", str(one), str(two), "--out", str(tmp_path / "m"))
    assert proc.returncode == 2 and "different selections" in proc.stderr, proc.stderr


def test_slurm_dry_run_prints_the_slots_and_the_makespan(tmp_path: Path) -> None:
    # No Slurm needed to plan: four worlds (one cell each) on two job slots, longest first.
    durations = tmp_path / "durations.json"
    ids = [c.split()[0] for c in run_cli("list", "--matrix", MATRIX, "--platform", "cpu")
           .stdout.splitlines() if c.endswith("@cpu")]
    durations.write_text(json.dumps({c: float(i + 1) for i, c in enumerate(sorted(ids))}))
    proc = run_cli("run", "--matrix", MATRIX, "--scheduler", "slurm", "--max-jobs", "2",
                   "--batch-size", "1", "--durations-from", str(durations), "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Weights 4, 3, 2, 1 (by id order) on 2 slots: {4, 1} and {3, 2}, makespan 5.
    assert "slurm: 4 jobs (one per world) on 2 slots (--max-jobs 2); expected makespan " \
        "5.0 s (serial 10.0 s)" in proc.stdout, proc.stdout
    assert proc.stdout.count("  slot ") == 2


def test_slurm_splits_a_platform_into_a_job_per_minute_of_work(tmp_path: Path) -> None:
    ids = [c.split()[0] for c in run_cli("list", "--matrix", MATRIX, "--platform", "cpu")
           .stdout.splitlines() if c.endswith("@cpu")]
    durations = tmp_path / "durations.json"

    def jobs(seconds: float, max_jobs: int) -> str:
        durations.write_text(json.dumps({c: seconds for c in ids}))
        proc = run_cli("run", "--matrix", MATRIX, "--scheduler", "slurm", "--max-jobs",
                       str(max_jobs), "--durations-from", str(durations), "--dry-run")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return next(ln for ln in proc.stdout.splitlines() if ln.startswith("slurm: "))

    assert len(ids) == 4
    # 4 x 100 s: a job per minute of work would be 7, capped at --max-jobs 3
    assert jobs(100.0, 3).startswith("slurm: 3 jobs (one per world) on 3 slots")
    # 4 x 20 s: 80 s of work, two jobs; 4 x 1 s: seconds of work stay in one job
    assert jobs(20.0, 8).startswith("slurm: 2 jobs (one per world) on 2 slots")
    assert jobs(1.0, 8).startswith("slurm: 1 jobs (one per world) on 1 slots")
