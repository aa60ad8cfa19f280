"""The verdicts of the anti-vacuous checks, without processes: fake meshes, fake DTensors
and values as the ranks would have sent them (``cpmatrix.parity.verdict``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.distributed.tensor import Partial, Replicate, Shard

from cpmatrix.parity.verdict import (
    ReplicaGroup,
    dim_names,
    grad_verdict,
    is_dtensor,
    mesh_is_trivial,
    meta_problems,
    pack,
    replica_groups,
    replica_meta,
    replica_problems,
    sharding_problems,
)
from fake_mesh import FakeDTensor, FakeMesh

MESH22 = FakeMesh((2, 2))
MESH12 = FakeMesh((1, 2))


def shard(local: tuple[int, ...], global_: tuple[int, ...], *placements: Any) -> FakeDTensor:
    return FakeDTensor(torch.zeros(local), placements, global_shape=global_)


# --------------------------------------------------------------------------------------
# meshes and DTensors


@pytest.mark.parametrize(("shape", "trivial"),
                         [((1, 1), True), ((1,), True), ((1, 2), False), ((3, 1), False)])
def test_only_a_mesh_of_ones_is_trivial(shape: tuple[int, ...], trivial: bool) -> None:
    assert mesh_is_trivial(FakeMesh(shape)) is trivial


def test_dim_names_fall_back_to_positions() -> None:
    assert dim_names(MESH22) == ("cp0", "cp1")
    assert dim_names(FakeMesh((2, 3), names=None)) == ("dim0", "dim1")


def test_is_dtensor_needs_a_tensor_with_placements_and_to_local() -> None:
    class NotATensor:
        placements = (Replicate(),)

        def to_local(self) -> torch.Tensor:
            return torch.zeros(1)

    assert is_dtensor(shard((1,), (2,), Shard(0)))
    assert not is_dtensor(torch.zeros(2))
    assert not is_dtensor(NotATensor())


# --------------------------------------------------------------------------------------
# sharding active


def test_trivial_mesh_is_skipped_whatever_the_inputs() -> None:
    out = sharding_problems({"x": torch.zeros(4)}, FakeMesh((1, 1)))
    assert out.ok and out.skipped.startswith("1x1 mesh") and not out.lines


def test_a_real_split_over_each_axis_is_evidence() -> None:
    out = sharding_problems({"x": shard((3, 4), (12, 4), Shard(0), Shard(0))}, MESH22)
    assert out.ok and not out.skipped
    assert out.lines == ["x: local (3, 4) < global (12, 4) on dim 0 over cp0",
                         "x: local (3, 4) < global (12, 4) on dim 0 over cp1"]


def test_a_shard_that_splits_nothing_is_a_problem() -> None:
    # Shard(1) over cp1 (size 2), but this rank holds all 4 columns: serial code in disguise
    split = shard((3, 4), (6, 4), Shard(0), Replicate())
    whole = shard((6, 4), (6, 4), Replicate(), Shard(1))
    out = sharding_problems({"x": split, "y": whole}, MESH22)
    assert out.problems == ["y: Shard(1) over cp1 (size 2) but local shape (6, 4) == "
                            "global (6, 4) on dim 1"]
    assert out.lines == ["x: local (3, 4) < global (6, 4) on dim 0 over cp0"]


def test_a_shard_that_splits_nothing_alone_gives_no_second_problem() -> None:
    out = sharding_problems({"y": shard((6,), (6,), Shard(0), Shard(0))}, MESH22)
    assert len(out.problems) == 2 and all("== global" in p for p in out.problems)


@pytest.mark.parametrize(
    "named",
    [
        {"x": torch.zeros(6, 4)},  # plain tensors only
        {"x": shard((6, 4), (6, 4), Replicate(), Replicate())},
        {"x": shard((6, 4), (6, 4), Partial(), Replicate())},  # Partial has no dim
        {"x": shard((3, 4), (6, 4), Shard(0), Replicate())},  # sharded over cp0 of size 1
        {"n": 3, "s": "text"},
    ],
)
def test_no_input_sharded_over_an_axis_above_one_is_a_problem(named: dict[str, Any]) -> None:
    out = sharding_problems(named, MESH12)
    assert len(out.problems) == 1 and not out.lines
    assert out.problems[0].startswith("mesh (1, 2) has an axis > 1 but nothing is sharded")
    assert "the parallel path would run as serial code" in out.problems[0]


def test_a_shard_over_an_axis_of_one_is_neither_evidence_nor_a_problem() -> None:
    out = sharding_problems({"x": shard((6, 4), (6, 4), Shard(0), Replicate()),
                             "y": shard((6, 2), (6, 4), Replicate(), Shard(1))}, MESH12)
    assert out.ok and out.lines == ["y: local (6, 2) < global (6, 4) on dim 1 over cp1"]


def test_a_plain_tensor_before_the_sharded_input_does_not_end_the_scan() -> None:
    named = {"mask": torch.ones(6), "count": 3, "x": shard((3, 4), (6, 4), Replicate(), Shard(0))}
    out = sharding_problems(named, MESH12)
    assert out.ok and out.lines == ["x: local (3, 4) < global (6, 4) on dim 0 over cp1"]


def test_messages_name_unnamed_mesh_dims_by_position() -> None:
    out = sharding_problems({"x": shard((4,), (4,), Shard(0), Shard(0))},
                            FakeMesh((2, 3), names=None))
    assert [p.split(" but")[0] for p in out.problems] == [
        "x: Shard(0) over dim0 (size 2)", "x: Shard(0) over dim1 (size 3)"]
    none = sharding_problems({}, FakeMesh((2, 3), names=None))
    assert "over ('dim0', 'dim1')" in none.problems[0]


# --------------------------------------------------------------------------------------
# replicated identical: which values, over which axis


def test_a_plain_tensor_must_agree_over_every_axis_above_one() -> None:
    x = torch.arange(3.0)
    groups = replica_groups({"n": 7, "x": x, "s": "text"}, MESH22)
    assert [(g.label, g.mesh_dim, list(g.tensors)) for g in groups] == [
        ("cp0", 0, ["x"]), ("cp1", 1, ["x"])]
    assert groups[0].tensors["x"] is x
    assert [g.label for g in replica_groups({"x": x}, MESH12)] == ["cp1"]
    assert replica_groups({"x": x}, FakeMesh((1, 1))) == []


def test_a_dtensor_agrees_only_where_it_is_replicated_and_by_its_local_data() -> None:
    local = torch.ones(2, 3)
    rows = FakeDTensor(local, (Shard(0), Replicate()), global_shape=(4, 3))
    partial = FakeDTensor(torch.ones(3), (Replicate(), Partial()))
    groups = replica_groups({"rows": rows, "partial": partial}, MESH22)
    assert [(g.label, list(g.tensors)) for g in groups] == [("cp0", ["partial"]),
                                                            ("cp1", ["rows"])]
    assert groups[1].tensors["rows"] is local  # never the global view


def test_groups_come_sorted_by_axis_name_and_keep_the_callers_order() -> None:
    mesh = FakeMesh((2, 2), names=("zz", "aa"))
    groups = replica_groups({"b": torch.zeros(1), "a": torch.zeros(1)}, mesh)
    assert [(g.label, g.mesh_dim, list(g.tensors)) for g in groups] == [
        ("aa", 1, ["b", "a"]), ("zz", 0, ["b", "a"])]


def test_pack_concatenates_bytes_in_order() -> None:
    a = torch.tensor([1.0, 2.0], dtype=torch.float64)
    b = torch.arange(6, dtype=torch.int16).reshape(2, 3).t()  # not contiguous
    packed = pack({"a": a, "b": b})
    assert packed.dtype == torch.uint8 and packed.numel() == 16 + 12
    assert torch.equal(packed[:16].view(torch.float64), a)
    assert torch.equal(packed[16:].view(torch.int16), b.reshape(-1))
    assert pack({}).dtype == torch.uint8 and pack({}).numel() == 0


def test_meta_is_names_shapes_and_dtypes_in_order() -> None:
    assert replica_meta({"a": torch.zeros(2, 3), "b": torch.zeros((), dtype=torch.int8)}) == [
        ("a", (2, 3), "torch.float32"), ("b", (), "torch.int8")]


def test_meta_problems_only_when_a_rank_disagrees() -> None:
    group = ReplicaGroup("cp1", 1, {"a": torch.zeros(2)})
    same = [[("a", (2,), "torch.float32")]] * 3
    assert meta_problems(group, [4, 5, 6], same) == []
    for odd in range(3):  # whichever rank disagrees, the first one included
        metas = [[("a", (3 if rank == odd else 2,), "torch.float32")] for rank in range(3)]
        (problem,) = meta_problems(group, [4, 5, 6], metas)
        assert problem.startswith("over cp1 (ranks [4, 5, 6]): names/shapes/dtypes differ: ")
        assert "(3,)" in problem


# --------------------------------------------------------------------------------------
# replicated identical: what the gathered bytes mean


def _three() -> dict[str, torch.Tensor]:
    # different sizes, so a wrong running offset reads another tensor's bytes
    return {"a": torch.arange(4.0), "b": torch.arange(8, dtype=torch.int32),
            "c": torch.arange(16.0, dtype=torch.float64)}


def _sent(changes: dict[int, tuple[str, int, float]], n: int = 3) -> list[torch.Tensor]:
    """What n ranks sent: all ``_three()``, except rank -> (name, index, new value)."""
    out = []
    for rank in range(n):
        tensors = _three()
        if rank in changes:
            name, index, value = changes[rank]
            tensors[name][index] = value
        out.append(pack(tensors))
    return out


def test_identical_replicas_have_no_problem() -> None:
    assert replica_problems(ReplicaGroup("cp0", 0, _three()), [0, 1, 2], _sent({})) == []


@pytest.mark.parametrize("name", ["a", "b", "c"])
@pytest.mark.parametrize("index", [0, -1])
def test_a_broadcast_bug_in_any_tensor_names_that_tensor_only(name: str, index: int) -> None:
    group = ReplicaGroup("cp0", 0, _three())
    (problem,) = replica_problems(group, [10, 11, 12], _sent({2: (name, index, 99.0)}))
    assert problem.startswith(f"{name}: differs over cp0 between rank 10 and ranks [12] ")
    assert problem.endswith("; a missing all-reduce/broadcast?)")


def test_every_differing_rank_and_the_worst_difference_are_reported() -> None:
    group = ReplicaGroup("cp1", 1, _three())
    sent = _sent({1: ("c", 15, 20.0), 2: ("c", 15, 115.0)})
    (problem,) = replica_problems(group, [0, 1, 2], sent)
    assert "ranks [1, 2] (max abs 100;" in problem  # |115 - 15|


def test_worst_difference_counts_nan_and_inf_as_inf_and_ints_as_zero() -> None:
    group = ReplicaGroup("cp0", 0, _three())
    for value in (float("nan"), float("inf")):
        (problem,) = replica_problems(group, [0, 1], _sent({1: ("a", 0, value)}, n=2))
        assert "(max abs inf;" in problem
    (problem,) = replica_problems(group, [0, 1], _sent({1: ("b", 0, 5)}, n=2))
    assert "(max abs 0;" in problem  # integers: only "differs" is evidence


def test_a_tensor_packed_at_an_odd_offset_is_still_measured() -> None:
    # a float64 after three float32s starts at byte 12: viewing it in place would raise
    tensors = {"s": torch.zeros(3), "d": torch.zeros(2, dtype=torch.float64)}
    group = ReplicaGroup("cp0", 0, tensors)
    sent = [pack(tensors), pack({"s": torch.zeros(3), "d": torch.tensor([0.0, 2.5],
                                                                       dtype=torch.float64)})]
    (problem,) = replica_problems(group, [0, 1], sent)
    assert problem.startswith("d: differs over cp0") and "(max abs 2.5;" in problem


def test_replicas_are_compared_bitwise() -> None:
    group = ReplicaGroup("cp0", 0, {"z": torch.zeros(1)})
    sent = [pack({"z": torch.zeros(1)}), pack({"z": -torch.zeros(1)})]  # 0.0 == -0.0
    (problem,) = replica_problems(group, [0, 1], sent)
    assert problem.startswith("z: differs") and "(max abs 0;" in problem


def test_a_group_of_one_rank_never_differs() -> None:
    group = ReplicaGroup("cp0", 0, _three())
    assert replica_problems(group, [3], _sent({}, n=1)) == []


# --------------------------------------------------------------------------------------
# grads


def test_grad_verdict_catches_missing_zero_and_nonfinite_grads() -> None:
    out = grad_verdict({
        "none": None,
        "zero": torch.zeros(3),
        "nan": torch.tensor([1.0, float("nan")]),
        "+inf": torch.tensor([1.0, float("inf")]),
        "-inf": torch.tensor([float("-inf"), 1.0, float("-inf")]),
        "fine": torch.tensor([0.0, -2.5]),
        "masked": torch.zeros(2),
        "empty": torch.zeros(0),
    }, allow_zero={"masked": "fully masked rows have no gradient"})
    assert out.problems == [
        "none: no gradient (not connected to the output?)",
        "zero: all zero (vacuous: 0 == 0 passes)",
        "nan: 1 non-finite elements",
        "+inf: 1 non-finite elements",
        "-inf: 2 non-finite elements",
        "empty: all zero (vacuous: 0 == 0 passes)",
    ]
    assert out.lines == ["fine: max abs 2.5",
                         "masked: all zero, allowed: fully masked rows have no gradient"]


def test_allow_zero_never_excuses_a_nonfinite_grad() -> None:
    out = grad_verdict({"g": torch.tensor([0.0, float("inf")])}, allow_zero={"g": "masked"})
    assert out.problems == ["g: 1 non-finite elements"]


@pytest.mark.parametrize("bad", [complex(float("inf"), 0.0), complex(0.0, float("nan"))])
def test_complex_grads_must_be_finite_too(bad: complex) -> None:
    out = grad_verdict({"z": torch.tensor([1 + 1j, bad], dtype=torch.complex128)})
    assert out.problems == ["z: 1 non-finite elements"]
    fine = grad_verdict({"z": torch.tensor([0j, 3 + 4j])})
    assert fine.ok and fine.lines == ["z: max abs 5"]


def test_integer_grads_are_judged_by_value_only() -> None:
    assert grad_verdict({"i": torch.tensor([0, -3])}).lines == ["i: max abs 3"]
    assert not grad_verdict({"i": torch.tensor([0, 0])}).ok


def test_a_grad_that_is_not_a_tensor_is_named_and_the_scan_goes_on() -> None:
    out = grad_verdict({"w": 3, "v": torch.ones(1)})
    assert out.problems == ["w: a int, not a tensor"]
    assert out.lines == ["v: max abs 1"]
