"""A multi-GPU host's plan, made here with no GPU (``--gpus N --dry-run``): cuda cells of
1, 2, 4 and 8 ranks (tests/resources/gpu_pack.yaml) packed onto the devices of one world,
several at once, each cell on devices no other cell holds at that moment. What a GPU
host then runs is this plan (the same code places the cells: plan/packing.py), started on
CPU ranks by the slot tests (tests/worlds/test_slots.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cli_runner import RES, run_cli

LINE = re.compile(r"^  (\S+)  ranks ([\d,-]+) at ([\d.]+) s  timeout=(\d+)s$")


def plan(tmp_path: Path, *args: str) -> tuple[str, list[tuple[str, set[int], float]]]:
    proc = run_cli("run", "--matrix", str(RES / "gpu_pack.yaml"), "--platform", "cuda",
                   "--dry-run", "--out", str(tmp_path), *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cells = []
    for line in proc.stdout.splitlines():
        m = LINE.match(line)
        if m:
            ranks: set[int] = set()
            for part in m.group(2).split(","):
                lo, _, hi = part.partition("-")
                ranks |= set(range(int(lo), int(hi or lo) + 1))
            cells.append((m.group(1), ranks, float(m.group(3))))
    return proc.stdout, cells


def width(cell_id: str) -> int:
    rows, cols = re.search(r",(\d)x(\d),", cell_id).groups()  # type: ignore[union-attr]
    return int(rows) * int(cols)


def test_eight_gpus_one_world_packed_with_the_makespan(tmp_path: Path) -> None:
    out, cells = plan(tmp_path, "--gpus", "8")
    assert "plan: 16 cells in 1 worlds" in out
    assert ("world cuda-w8-b0: 8 ranks, 16 cells; expected makespan 8.0 s (one cell at a "
            "time 16.0 s), up to 4 cells at once, ranks busy 94%") in out
    assert "host: 1 jobs on 1 slots (--jobs 1); expected makespan 8.0 s" in out
    assert len(cells) == 16
    for cell_id, ranks, _ in cells:
        assert len(ranks) == width(cell_id) and ranks <= set(range(8))
    # Each cell is expected to take 1 s (a sixtieth of its timeout): cells that start at
    # the same time run side by side, so their devices must be disjoint ...
    by_start: dict[float, list[set[int]]] = {}
    for _, ranks, start in cells:
        by_start.setdefault(start, []).append(ranks)
    for start, sets in by_start.items():
        assert sum(map(len, sets)) == len(set().union(*sets)), (start, sets)
    # ... and every GPU is busy until the 1-GPU cells at the end (4 of them on 8 GPUs).
    assert [sum(map(len, by_start[t])) for t in sorted(by_start)] == [8] * 7 + [4]
    assert sorted(by_start) == [float(t) for t in range(8)]


def test_serial_packing_is_one_cell_at_a_time(tmp_path: Path) -> None:
    out, cells = plan(tmp_path, "--gpus", "8", "--pack", "serial")
    assert "expected makespan 16.0 s (one cell at a time 16.0 s), up to 1 cells at once" \
        in out
    assert sorted(start for _, _, start in cells) == [float(t) for t in range(16)]


@pytest.mark.parametrize(("gpus", "cells", "ranks", "makespan"),
                         [("1", 4, 1, "4.0"), ("2", 8, 2, "6.0"), ("4", 12, 4, "7.0")])
def test_fewer_gpus_fewer_cells_fit_and_one_gpu_runs_one_at_a_time(
        gpus: str, cells: int, ranks: int, makespan: str, tmp_path: Path) -> None:
    out, placed = plan(tmp_path, "--gpus", gpus)
    assert f"world cuda-w{ranks}-b0: {ranks} ranks, {cells} cells; expected makespan " \
        f"{makespan} s" in out
    assert all(r <= set(range(ranks)) for _, r, _ in placed)
    if gpus == "1":
        assert "up to 1 cells at once" in out


@pytest.mark.parametrize("extra", [(), ("--keep-order",)])
def test_jobs_keep_a_cuda_platform_in_one_world_over_every_gpu(
        extra: tuple[str, ...], tmp_path: Path) -> None:
    """Two worlds of 4 GPUs could not run an 8-GPU cell beside anything; one world of 8
    packs the narrow cells side by side instead (the cpu platform still splits).
    ``--keep-order`` runs that world's cells one at a time, still in one world."""
    out, _ = plan(tmp_path, "--gpus", "8", "--jobs", "2", *extra)
    assert "plan: 16 cells in 1 worlds" in out and "cuda-w8-b0: 8 ranks, 16 cells" in out
    assert ("up to 1 cells at once" in out) == bool(extra)


def test_world_ranks_caps_the_gpus_a_world_takes(tmp_path: Path) -> None:
    out, placed = plan(tmp_path, "--gpus", "8", "--world-ranks", "4", "-k", "not 2x4")
    assert "world cuda-w4-b0: 4 ranks, 12 cells" in out
    assert all(r <= set(range(4)) for _, r, _ in placed)
