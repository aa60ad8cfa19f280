"""One world per platform (tests/resources/shared_world.yaml, gloo): cells of 1, 2 and 4
ranks share one 4-rank world, each in a process group of exactly its own size, and a
fault stays with its cell: a rank of a small cell blames only that cell. (Cells at once
on disjoint ranks, and a rank's death between cells: tests/worlds/test_slots.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import RES, run_cli


def results(out: Path) -> dict[str, dict]:
    return {r["cell_id"]: r for r in json.loads((out / "results.json").read_text())}


def worlds(out: Path) -> list[Path]:
    """The world launches of a run (one folder each)."""
    return [p for p in (out / "worlds").iterdir() if p.is_dir()]


def cid(target: str, mesh: str) -> str:
    return f"{target}[unit,{mesh},fp64,autocast=off,reference]@cpu"


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["fork", "torchrun"])
def test_cells_of_every_size_run_in_one_world_each_in_a_group_of_its_size(
        launcher: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_cli("run", "--matrix", str(RES / "shared_world.yaml"), "-k", "sizes",
                   "--launcher", launcher, "--out", str(out), "--plain", "--no-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(1 planned world, 1 world start)" in proc.stdout
    assert len(worlds(out)) == 1
    by_id = results(out)
    for mesh, size in (("1x1", 1), ("1x2", 2), ("2x1", 2), ("2x2", 4)):
        r = by_id[cid("sizes", mesh)]
        assert r["status"] == "passed", r
        ev = r["evidence"]
        assert (ev["dist_world_size"], ev["env_world_size"], ev["flat_sum"]) == \
            (size, size, float(size)), ev


@pytest.mark.slow
def test_a_crash_in_a_small_cell_blames_only_its_rank_and_cell(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_cli("run", "--matrix", str(RES / "shared_world.yaml"), "-k",
                   "sizes or crash_small", "--out", str(out), "--plain", "--no-cache")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    by_id = results(out)
    crash = by_id[cid("crash_small", "1x2")]
    assert (crash["status"], crash["failing_ranks"]) == ("crash", [1]), crash
    assert "exited with code 13" in json.dumps(crash["failures"])
    assert all(by_id[cid("sizes", m)]["status"] == "passed"
               for m in ("1x1", "1x2", "2x1", "2x2"))
