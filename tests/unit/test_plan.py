"""The planner is pure: grouping, longest-first ordering, batch cuts, device pool."""

from __future__ import annotations

import pytest

from cpmatrix.matrix.schema import Cell, Mesh
from cpmatrix.plan.batches import DevicePool, plan_batches


def cell(name: str, mesh: str, timeout: int = 60, platform: str = "cpu") -> Cell:
    return Cell(id=f"{name}[unit,{mesh},fp64,autocast=off,reference]@{platform}", target=name,
                case="m:f", kind="parity", level="unit", mesh=Mesh.parse(mesh), dtype="fp64",
                autocast=False, path="reference", params=(), platform=platform,
                timeout_s=timeout, tags=())


def test_one_world_per_platform_sized_for_its_largest_cell_cells_largest_first() -> None:
    cells = [cell("a", "1x1"), cell("b", "2x2"), cell("c", "1x4"), cell("d", "3x3"),
             cell("e", "2x2", platform="cuda")]
    batches = plan_batches(cells)
    assert [(b.platform, b.world_size, [c.target for c in b.cells]) for b in batches] == [
        ("cpu", 9, ["d", "b", "c", "a"]), ("cuda", 4, ["e"])]


def test_a_batch_is_sized_for_its_own_largest_cell() -> None:
    cells = [cell("a", "1x1"), cell("b", "2x2"), cell("d", "3x3")]
    batches = plan_batches(cells, batch_size=2)
    assert [(b.world_size, [c.target for c in b.cells]) for b in batches] == [
        (9, ["d", "b"]), (1, ["a"])]


def test_keep_order_keeps_matrix_order_within_a_size() -> None:
    cells = [cell("x", "1x1"), cell("y", "2x2"), cell("z", "1x1", timeout=900)]
    (batch,) = plan_batches(cells, keep_order=True)
    assert [c.target for c in batch.cells] == ["y", "x", "z"]


@pytest.mark.parametrize(
    ("durations", "expected"),
    [
        ({}, ["slow", "mid", "fast"]),  # by timeout when nothing was recorded
        ({"fast": 9.0, "mid": 0.1, "slow": 0.2}, ["fast", "slow", "mid"]),  # recorded wins
    ],
)
def test_longest_first(durations: dict[str, float], expected: list[str]) -> None:
    cells = [cell("fast", "2x2", 60), cell("slow", "2x2", 900), cell("mid", "2x2", 300)]
    ids = {c.target: c.id for c in cells}
    batches = plan_batches(cells, durations={ids[k]: v for k, v in durations.items()})
    assert [c.target for c in batches[0].cells] == expected


def test_keep_order_and_batch_size() -> None:
    cells = [cell(f"t{i}", "1x2", timeout=60 + i) for i in range(5)]
    batches = plan_batches(cells, batch_size=2, keep_order=True)
    assert [[c.target for c in b.cells] for b in batches] == [["t0", "t1"], ["t2", "t3"], ["t4"]]
    assert len({b.name for b in batches}) == 3


def test_mutants_become_entries() -> None:
    c = cell("a", "1x2")
    (batch,) = plan_batches([c], mutants={c.id: ["", "no_allreduce"]})
    assert [batch.mutant_of(i) for i in range(len(batch.cells))] == ["", "no_allreduce"]


def test_device_pool_gives_disjoint_sets() -> None:
    pool = DevicePool(8)
    sets = [pool.take(2) for _ in range(4)]
    assert pool.take(2) is None
    flat = [d for s in sets if s for d in s]
    assert sorted(flat) == list(range(8))
    pool.give(sets[1] or ())
    assert pool.take(2) == sets[1]


@pytest.mark.parametrize(
    ("devices", "fits", "left_out"),
    [
        (1, ["a1", "cpu4", "spill"], {"b2": 2, "c4": 4}),
        (2, ["a1", "b2", "cpu4", "spill"], {"c4": 4}),
        (4, ["a1", "b2", "c4", "cpu4", "spill"], {}),
    ],
)
def test_fit_to_devices_leaves_out_cuda_cells_wider_than_the_gpus(
    devices: int, fits: list[str], left_out: dict[str, int],
) -> None:
    from dataclasses import replace

    from cpmatrix.kinds.executors import EXECUTORS
    from cpmatrix.matrix.schema import Platform
    from cpmatrix.supervise.options import RunOptions
    from cpmatrix.supervise.setup import devices_for

    cells = [cell("a1", "1x1", platform="cuda"), cell("b2", "1x2", platform="cuda"),
             cell("c4", "2x2", platform="cuda"), cell("cpu4", "2x2"),
             # a spill cell compiles without a device, whatever its mesh
             replace(cell("spill", "2x2", platform="cuda"), kind="spill")]
    platforms = {"cuda": Platform(name="cuda", backend="nccl", device="cuda"),
                 "cpu": Platform(name="cpu", backend="gloo", device="cpu")}
    pool, got, out, needs = devices_for(cells, platforms, RunOptions(gpus=devices),
                                        executors=EXECUTORS)
    assert (pool, needs) == (devices, True)
    assert [c.target for c in got] == fits
    assert {c.target: why for c, why in out} == {
        t: f"needs {n} GPUs (one per rank); {devices} visible" for t, n in left_out.items()}


def test_jobs_split_a_platform_into_balanced_worlds_each_cell_once() -> None:
    cells = [cell(f"c{i}", "2x2" if i % 3 else "1x1") for i in range(12)]
    durations = {c.id: float(i + 1) for i, c in enumerate(cells)}  # 1..12 s, 78 s in all
    batches = plan_batches(cells, durations=durations, worlds=3)
    assert len(batches) == 3
    ids = [c.id for b in batches for c in b.cells]
    assert sorted(ids) == sorted(c.id for c in cells)  # every cell in exactly one world
    loads = [sum(durations[c.id] for c in b.cells) for b in batches]
    assert max(loads) - min(loads) <= 1.0, loads  # LPT on 1..12 over 3: 26 each
    for b in batches:  # each world still largest first, then longest first
        keys = [(-c.world_size, -durations[c.id]) for c in b.cells]
        assert keys == sorted(keys)
        assert b.world_size == max(c.world_size for c in b.cells)
    assert len({b.name for b in batches}) == 3
    # one world (the default) is the plan of a single job slot
    assert [len(b.cells) for b in plan_batches(cells, durations=durations)] == [12]
    # more worlds than cells: no empty world
    assert len(plan_batches(cells[:2], durations=durations, worlds=5)) == 2
