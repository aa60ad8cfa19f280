"""DTensors on meshes derived from the cell's (issue 12): sub-meshes, flattened meshes.

Which cell axes a DTensor's own mesh runs along, which ranks must then hold identical
bytes, what counts as sharded, and what is not part of the cell's mesh (pure verdicts on
fake meshes; the collectives on a fake world). The reported cases on real gloo worlds are in
``tests/worlds/test_parity_submesh_worlds.py``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from cpmatrix.parity import (
    ReplicationError,
    VacuousError,
    assert_replicated_identical,
    assert_sharding_active,
)
from cpmatrix.parity import checks as checks_module
from cpmatrix.parity.checks import replicated_problems
from cpmatrix.parity.verdict import (
    identical_dims,
    mesh_axes,
    placed,
    placement_problems,
    replica_groups,
    sharding_problems,
)
from fake_mesh import FakeDTensor, FakeMesh, FakeWorld


def on(mesh: FakeMesh | None, local: tuple[int, ...], global_: tuple[int, ...],
       *placements: Any) -> FakeDTensor:
    return FakeDTensor(torch.zeros(local), placements, global_shape=global_, mesh=mesh)


# --------------------------------------------------------------------------------------
# which cell axes a DTensor's mesh runs along


@pytest.mark.parametrize(("shape", "rank", "derive", "spans"), [
    ((2, 2), 3, lambda m: m, ((0,), (1,))),
    ((2, 2), 3, lambda m: m["cp1"], ((1,),)),
    ((2, 2), 2, lambda m: m["cp0"], ((0,),)),
    ((2, 2), 1, lambda m: m[("cp1", "cp0")], ((1,), (0,))),
    ((2, 2), 0, lambda m: m.flatten(), ((0, 1),)),
    ((1, 3), 2, lambda m: m["cp1"], ((1,),)),
    ((1, 3), 1, lambda m: m["cp0"], ((),)),  # a dim of size 1 runs along none
    ((2, 3), 4, lambda m: m.flatten("dp"), ((0, 1),)),
    ((3, 1), 2, lambda m: m["cp0"], ((0,),)),
])
def test_a_derived_mesh_runs_along_the_cell_axes_it_spans(
    shape: tuple[int, int], rank: int, derive: Any, spans: tuple[tuple[int, ...], ...],
) -> None:
    cell = FakeMesh(shape, rank=rank)
    assert mesh_axes(derive(cell), cell) == spans


def test_a_permuted_flattened_mesh_still_runs_along_both_axes() -> None:
    cell = FakeMesh((2, 2))
    assert mesh_axes(FakeMesh((4,), ("w",), ranks=torch.tensor([3, 1, 0, 2])), cell) == ((0, 1),)


@pytest.mark.parametrize(("ranks", "shape", "message"), [
    ([0, 1, 2, 3, 4, 5], (6,),
     r"its ranks \[4, 5\] are outside the cell's mesh \[\[0, 1\], \[2, 3\]\]"),
    ([0, 3], (2,),
     r"its dim w \(2 ranks\) runs across the cell's dims \('cp0', 'cp1'\) \(4 ranks\)"),
    ([[0, 3], [2, 1]], (2, 2), r"its dim x \(2 ranks\) runs across the cell's dims"),
    ([[0, 1], [1, 0]], (2, 2), r"its ranks \[\[0, 1\], \[1, 0\]\] repeat"),
])
def test_a_mesh_that_is_not_part_of_the_cell_is_named_with_its_reason(
    ranks: Any, shape: tuple[int, ...], message: str,
) -> None:
    names = ("w",) if len(shape) == 1 else ("w", "x")
    with pytest.raises(ValueError, match=message):
        mesh_axes(FakeMesh(shape, names, ranks=torch.tensor(ranks)), FakeMesh((2, 2)))


def test_placed_pairs_each_placement_with_its_own_mesh_dim() -> None:
    cell = FakeMesh((2, 2), rank=1)
    on_cp1 = placed(on(cell["cp1"], (2,), (4,), Shard(0)), cell)
    assert [(p.name, p.size, p.cell_dims, p.placement) for p in on_cp1] == [
        ("cp1", 2, (1,), Shard(0))]
    # a duck-typed DTensor without a mesh of its own lies on the cell's mesh
    plain = placed(on(None, (2,), (4,), Shard(0), Replicate()), cell)
    assert [(p.name, p.cell_dims) for p in plain] == [("cp0", (0,)), ("cp1", (1,))]
    with pytest.raises(ValueError, match=r"2 placements .* for its 1-D mesh"):
        placed(on(cell["cp1"], (2,), (4,), Shard(0), Shard(0)), cell)
    # nor does anything without a device_mesh attribute at all
    duck = placed(SimpleNamespace(placements=(Replicate(), Shard(0))), cell)
    assert [(p.name, p.cell_dims) for p in duck] == [("cp0", (0,)), ("cp1", (1,))]


FOREIGN = FakeMesh((2,), ("w",), ranks=torch.tensor([0, 3]))  # diagonal across a 2x2


def test_a_foreign_value_first_does_not_end_any_scan() -> None:
    cell = FakeMesh((2, 2), rank=3)
    named = {"odd": on(FOREIGN, (1,), (2,), Shard(0)),
             "odd too": on(FakeMesh((4,), ("world",), ranks=torch.tensor([0, 1, 2, 9])),
                           (1,), (4,), Shard(0)),
             "w": on(cell["cp1"], (2,), (4,), Shard(0))}
    assert [p.split(":")[0] for p in placement_problems(named, cell)] == ["odd", "odd too"]
    assert {g.label: list(g.tensors) for g in replica_groups(named, cell)} == {"cp0": ["w"]}
    assert sharding_problems(named, cell).summary == "w over cp1"


# --------------------------------------------------------------------------------------
# which ranks must hold identical bytes


@pytest.mark.parametrize(("derive", "placements", "identical"), [
    (lambda m: m["cp1"], (Shard(0),), [0]),       # TP weight: identical over cp0 only
    (lambda m: m["cp1"], (Replicate(),), [0, 1]),
    (lambda m: m["cp0"], (Partial(),), [1]),      # a pending sum over cp0
    (lambda m: m.flatten(), (Shard(0),), []),
    (lambda m: m.flatten(), (Replicate(),), [0, 1]),
    (lambda m: m, (Shard(0), Replicate()), [1]),
    (lambda m: m, (_StridedShard(0, split_factor=2), Shard(0)), []),  # FSDP2 + TP
])
def test_identical_over_the_cell_axes_no_shard_or_partial_runs_along(
    derive: Any, placements: tuple[Any, ...], identical: list[int],
) -> None:
    cell = FakeMesh((2, 2), rank=2)
    assert identical_dims(on(derive(cell), (2,), (4,), *placements), cell) == identical


def test_a_size_one_axis_is_never_a_replica_group() -> None:
    cell = FakeMesh((1, 2))
    assert identical_dims(torch.zeros(2), cell) == [1]
    assert identical_dims(on(cell["cp0"], (2,), (2,), Shard(0)), cell) == [1]


def test_replica_groups_place_sub_mesh_values_by_their_own_placements() -> None:
    cell = FakeMesh((2, 2), rank=3)
    named = {
        "w": on(cell["cp1"], (2,), (4,), Shard(0)),        # TP on cp1: identical over cp0
        "b": on(cell["cp1"], (4,), (4,), Replicate()),     # identical everywhere
        "g": on(cell.flatten(), (1,), (4,), Shard(0)),     # sharded over the whole mesh
        "odd": on(FakeMesh((2,), ("w",), ranks=torch.tensor([0, 3])), (1,), (2,), Shard(0)),
    }
    groups = {g.label: list(g.tensors) for g in replica_groups(named, cell)}
    assert groups == {"cp0": ["w", "b"], "cp1": ["b"]}


# --------------------------------------------------------------------------------------
# what counts as sharded


def test_sharded_parameters_on_a_sub_mesh_are_evidence_named_by_their_axis() -> None:
    cell = FakeMesh((1, 2), rank=1)
    named = {
        "input x": torch.zeros(5, 8),
        "param up.weight": on(cell["cp1"], (6, 8), (12, 8), Shard(0)),
        "param down.weight": on(cell["cp1"], (8, 6), (8, 12), Shard(1)),
        "param down.bias": on(cell["cp1"], (8,), (8,), Replicate()),
    }
    out = sharding_problems(named, cell)
    assert out.ok, out.problems
    assert out.lines == ["param up.weight: local (6, 8) < global (12, 8) on dim 0 over cp1",
                         "param down.weight: local (8, 6) < global (8, 12) on dim 1 over cp1"]
    assert out.summary == "param up.weight over cp1; param down.weight over cp1"


def test_a_strided_shard_and_a_flattened_axis_count() -> None:
    cell = FakeMesh((2, 2))
    named = {"w": on(cell, (3, 8), (12, 8), _StridedShard(0, split_factor=2), Shard(0)),
             "x": on(cell.flatten(), (2, 8), (8, 8), Shard(0))}
    out = sharding_problems(named, cell)
    assert out.ok and out.summary == "w over cp0+cp1; x over cp0_cp1"


def test_a_shard_over_a_size_one_sub_axis_or_a_foreign_mesh_is_no_evidence() -> None:
    cell = FakeMesh((2, 1))
    named = {"w": on(cell["cp1"], (4,), (4,), Shard(0)),
             "odd": on(FakeMesh((3,), ("w",), ranks=torch.tensor([0, 1, 2])), (1,), (3,),
                       Shard(0))}
    out = sharding_problems(named, cell)
    assert not out.lines and out.summary == ""
    assert out.problems[0].startswith("mesh (2, 1) has an axis > 1 but nothing is sharded")


def test_placement_problems_name_each_dtensor_on_a_foreign_mesh() -> None:
    cell = FakeMesh((1, 2))
    world = FakeMesh((4,), ("world",))
    named = {"x": on(world, (1,), (4,), Shard(0)), "ok": on(cell["cp1"], (1,), (2,), Shard(0)),
             "plain": torch.zeros(1), "n": 3}
    assert placement_problems(named, cell) == [
        "x: a DTensor on a mesh not part of the cell's mesh: its ranks [2, 3] are outside "
        "the cell's mesh [[0, 1]]"]


def test_the_public_checks_fail_a_foreign_mesh_with_their_check_name() -> None:
    cell = FakeMesh((1, 2))
    odd = {"x": on(FakeMesh((4,), ("world",)), (1,), (4,), Shard(0))}
    with pytest.raises(VacuousError, match="not part of the cell's mesh") as info:
        assert_sharding_active(odd, cell)
    assert info.value.check == "sharding_active"
    # no replicated value is left to gather: the check fails before any collective
    with pytest.raises(ReplicationError, match="not part of the cell's mesh") as rep:
        assert_replicated_identical(odd, FakeMesh((1, 1)))
    assert rep.value.check == "replicated_identical"


# --------------------------------------------------------------------------------------
# the collectives, with every rank's own sub-mesh values


def _tp_grads(mesh: FakeMesh, bug: bool) -> dict[str, Any]:
    """What TP on cp1 leaves on each rank of a 2x2 mesh: the weight grad's shard (differs
    over cp1, identical over cp0), and a replicated bias grad."""
    row, col = mesh.get_coordinate()
    shard = torch.full((2,), float(col))
    if bug and row == 1:  # rank (1, 1) never got its all-reduce over cp0
        shard = shard + 0.5 * col
    return {"w": FakeDTensor(shard, (Shard(0),), global_shape=(4,), mesh=mesh["cp1"]),
            "b": FakeDTensor(torch.ones(3), (Replicate(),), global_shape=(3,),
                             mesh=mesh["cp1"])}


@pytest.mark.parametrize("bug", [False, True])
def test_sub_mesh_replicas_are_compared_over_the_axis_their_mesh_does_not_span(
    monkeypatch: pytest.MonkeyPatch, bug: bool,
) -> None:
    world = FakeWorld((2, 2))
    monkeypatch.setattr(checks_module, "dist", world)
    outs = world.run(lambda mesh: replicated_problems(_tp_grads(mesh, bug), mesh))
    if not bug:
        assert all(o.ok for o in outs)
        # w is sharded over cp1 (checked over cp0 only), b replicated everywhere
        assert outs[0].lines == ["2 tensors bitwise identical over cp0",
                                 "1 tensors bitwise identical over cp1"]
    else:
        assert outs[1].problems == outs[3].problems == [
            "w: differs over cp0 between rank 1 and ranks [3] (max abs 0.5; a missing "
            "all-reduce/broadcast?)"]
        assert outs[0].ok and outs[2].ok  # column 0: the bug adds 0.5 * 0
