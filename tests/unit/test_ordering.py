"""``cpmatrix run --order matrix|reverse|random[:SEED]`` (``cpmatrix.plan.ordering``): the
parsed order, the cells in it, a world planned in it, and the seed that repeats it.
``tests/worlds/test_order.py`` runs the reference suite and the recipes in all three."""

from __future__ import annotations

import doctest

import pytest

from cpmatrix.errors import UsageError
from cpmatrix.matrix.schema import Cell, Mesh
from cpmatrix.plan import ordering
from cpmatrix.plan.batches import plan_batches
from cpmatrix.plan.ordering import Order, arrange, parse_order
from cpmatrix.plan.packing import PackSpec
from cpmatrix.supervise.options import RunOptions


def test_doctests_run() -> None:
    result = doctest.testmod(ordering)
    assert result.failed == 0 and result.attempted >= 4


def test_parse_order() -> None:
    assert parse_order("matrix") == Order("matrix")
    assert parse_order("reverse") == Order("reverse")
    assert parse_order("random:0") == Order("random", 0)
    fresh = {parse_order("random").seed for _ in range(5)}
    assert None not in fresh and len(fresh) > 1  # a fresh seed each time, printed
    for bad in ("", "Matrix", "random:-1", "random:x", "reverse:3", "random:"):
        with pytest.raises(UsageError, match="--order"):
            parse_order(bad)
    with pytest.raises(UsageError, match="--order"):
        RunOptions(order="sideways")


def test_a_seed_repeats_its_order_and_another_seed_gives_another() -> None:
    items = list(range(50))
    a = arrange(items, Order("random", 1))
    assert a == arrange(items, Order("random", 1)) != arrange(items, Order("random", 2))
    assert sorted(a) == items and a != items
    assert arrange(items, Order("matrix")) == items
    assert arrange(items, Order("reverse")) == items[::-1]
    assert items == list(range(50)), "never in place"


def _cell(i: int, mesh: str) -> Cell:
    return Cell(id=f"t{i}", target="t", case="m:f", kind="parity", level="unit",
                mesh=Mesh.parse(mesh), dtype="fp64", autocast=False, path="reference",
                params=(), platform="cpu", timeout_s=60, tags=())


def test_an_ordered_world_keeps_the_given_order_as_its_priority() -> None:
    cells = [_cell(1, "1x1"), _cell(2, "2x2"), _cell(3, "1x2"), _cell(4, "1x1")]
    planned = plan_batches(cells, pack=PackSpec(), durations={"t1": 9.0})
    assert [c.id for c in planned[0].cells] == ["t2", "t3", "t1", "t4"]  # widest first
    (batch,) = plan_batches(cells, pack=PackSpec(ordered=True))
    assert [c.id for c in batch.cells] == ["t1", "t2", "t3", "t4"]
    assert batch.packing is not None
    # Slots: t1 (1 rank) starts first; t2 (4 ranks) does not fit beside it and waits,
    # never blocking t3 and t4, which fit the free ranks (a priority, not a queue).
    assert [batch.cells[i].id for i in batch.packing.order] == ["t1", "t3", "t4", "t2"]
    serial = plan_batches(cells, pack=PackSpec(ordered=True, serial=True))[0]
    assert [c.id for c in serial.cells] == ["t1", "t2", "t3", "t4"]
    # --keep-order still groups by size (widest first), the order kept within a size.
    kept = plan_batches(arrange(cells, Order("reverse")), keep_order=True,
                        pack=PackSpec(ordered=True, serial=True))[0]
    assert [c.id for c in kept.cells] == ["t2", "t3", "t4", "t1"]
