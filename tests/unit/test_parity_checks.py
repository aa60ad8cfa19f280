"""The anti-vacuous checks on a fake world: every rank a thread, the collectives an
in-memory rendezvous (``tests/fake_mesh.py``), so the code that gathers runs end to end in
milliseconds. The real gloo collectives run in tests/worlds/test_parity_worlds.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.tensor import Replicate, Shard

from cpmatrix.parity import (
    CHECKS,
    ParityError,
    ReplicationError,
    VacuousError,
    assert_grads_nonzero_finite,
    assert_replicated_identical,
    assert_sharding_active,
    check_of,
    checks,
    perturb_degenerate_,
)
from cpmatrix.parity.checks import gather_object_over_mesh, grad_problems, replicated_problems
from fake_mesh import FakeDTensor, FakeMesh, FakeWorld


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``world(shape)``: a fake world patched in as the checks' ``torch.distributed``."""

    def make(shape: tuple[int, ...], names: tuple[str, ...] | None = ("cp0", "cp1")) -> FakeWorld:
        fake = FakeWorld(shape, names)
        monkeypatch.setattr(checks, "dist", fake)
        return fake

    yield make


# --------------------------------------------------------------------------------------
# gathering over the mesh


@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (2, 1), (2, 2), (2, 3), (3, 2)])
def test_gather_over_mesh_returns_every_rank_in_row_major_order(
    world: Any, shape: tuple[int, ...],
) -> None:
    fake = world(shape)
    results = fake.run(lambda mesh: gather_object_over_mesh({"rank": mesh.rank}, mesh))
    everyone = [{"rank": r} for r in range(fake.size)]
    assert results == [everyone] * fake.size
    # only the mesh's own groups, one gather per axis > 1 (never the world group)
    for rank, calls in fake.calls.items():
        groups = [fake.mesh(rank).get_group(d).ranks for d in reversed(range(len(shape)))
                  if shape[d] > 1]
        assert calls == [("all_gather_object", g) for g in groups]


# --------------------------------------------------------------------------------------
# replicated identical


def _three(rank: int, broken: int | None = None) -> dict[str, Any]:
    """Three replicated tensors of different sizes; ``broken`` misses the broadcast of the
    third one's last element (it keeps a rank-dependent value)."""
    c = torch.arange(16.0, dtype=torch.float64)
    if rank == broken:
        c[-1] = 100.0 + rank
    return {"a": torch.arange(4.0), "b": torch.arange(8, dtype=torch.int32), "c": c, "n": 3}


def test_identical_replicas_pass_with_evidence_per_axis(world: Any) -> None:
    fake = world((2, 2))
    for out in fake.run(lambda mesh: replicated_problems(_three(mesh.rank), mesh)):
        assert out.ok and not out.skipped
        assert out.lines == ["3 tensors bitwise identical over cp0",
                             "3 tensors bitwise identical over cp1"]
    # per axis: names/shapes/dtypes first, then the bytes
    assert [op for op, _ in fake.calls[3]] == ["all_gather_object", "all_gather"] * 2


def test_a_broadcast_bug_in_the_third_tensor_is_found_over_both_axes(world: Any) -> None:
    fake = world((2, 2))
    outs = fake.run(lambda mesh: replicated_problems(_three(mesh.rank, broken=3), mesh))
    cp0 = "c: differs over cp0 between rank 1 and ranks [3] (max abs 88;"
    cp1 = "c: differs over cp1 between rank 2 and ranks [3] (max abs 88;"
    assert outs[0].ok and outs[0].lines == ["3 tensors bitwise identical over cp0",
                                            "3 tensors bitwise identical over cp1"]
    assert [p.split(" a missing")[0] for p in outs[1].problems] == [cp0]
    assert outs[1].lines == []  # no evidence line once a problem was found
    assert [p.split(" a missing")[0] for p in outs[2].problems] == [cp1]
    assert outs[2].lines == ["3 tensors bitwise identical over cp0"]
    assert [p.split(" a missing")[0] for p in outs[3].problems] == [cp0, cp1]


def test_replicas_that_disagree_on_shapes_skip_the_byte_gather(world: Any) -> None:
    fake = world((1, 3))

    def check(mesh: FakeMesh) -> Any:
        values = {"x": torch.zeros(2 if mesh.rank != 1 else 3)}
        return replicated_problems(values, mesh)

    for out in fake.run(check):
        (problem,) = out.problems
        assert problem.startswith("over cp1 (ranks [0, 1, 2]): names/shapes/dtypes differ")
    assert fake.calls[0] == [("all_gather_object", (0, 1, 2))]


def test_sharded_axes_are_not_compared(world: Any) -> None:
    fake = world((1, 2))

    def check(mesh: FakeMesh) -> Any:
        local = torch.full((2,), float(mesh.rank))  # different rows on each rank: fine
        rows = FakeDTensor(local, (Replicate(), Shard(0)), global_shape=(4,))
        return replicated_problems({"rows": rows}, mesh)

    for out in fake.run(check):
        assert out.ok and out.skipped == (
            "nothing here is replicated over more than one rank (a 1-rank mesh, or every "
            "value sharded): nothing to compare across ranks")
    assert fake.calls[0] == []


def test_assert_replicated_identical_raises_on_every_rank_that_sees_it(world: Any) -> None:
    fake = world((1, 2))

    def check(mesh: FakeMesh) -> str:
        try:
            assert_replicated_identical(_three(mesh.rank, broken=1), mesh)
        except ReplicationError as exc:
            return f"{exc.check}|{exc}"
        return "passed"

    for text in fake.run(check):
        assert text.startswith("replicated_identical|replicated_identical: c: differs over cp1")

    def two(mesh: FakeMesh) -> str:
        values = {"a": torch.full((1,), float(mesh.rank)), "b": torch.full((1,), -mesh.rank)}
        try:
            assert_replicated_identical(values, mesh)
        except ReplicationError as exc:
            return str(exc)
        return "passed"

    for text in fake.run(two):
        assert "broadcast?); b: differs over cp1" in text  # every problem, "; "-joined
    ok = fake.run(lambda mesh: assert_replicated_identical(_three(mesh.rank), mesh))
    assert all(out.lines == ["3 tensors bitwise identical over cp1"] for out in ok)


# --------------------------------------------------------------------------------------
# sharding active (pure: every rank judges its own shard)


def test_assert_sharding_active_raises_a_vacuous_error() -> None:
    mesh = FakeMesh((1, 2))
    whole = FakeDTensor(torch.zeros(4), (Replicate(), Shard(0)), global_shape=(4,))
    with pytest.raises(VacuousError) as info:
        assert_sharding_active({"x": whole}, mesh)
    assert info.value.check == "sharding_active"
    assert str(info.value).startswith("sharding_active: x: Shard(0) over cp1 (size 2)")
    with pytest.raises(VacuousError) as info:
        assert_sharding_active({"x": whole, "y": whole}, mesh)
    assert "on dim 0; y: Shard(0) over cp1" in str(info.value)  # every problem, "; "-joined
    split = FakeDTensor(torch.zeros(2), (Replicate(), Shard(0)), global_shape=(4,))
    assert assert_sharding_active({"x": split}, mesh).lines == [
        "x: local (2,) < global (4,) on dim 0 over cp1"]


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3))
    nn.init.zeros_(model[2].weight)  # a zero-init "final" projection
    nn.init.zeros_(model[2].bias)
    return model.double()


def test_perturbs_zero_and_constant_params_only() -> None:
    model = _model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    changed = perturb_degenerate_(model, torch.Generator().manual_seed(1))
    # LayerNorm's ones/zeros hide permutation bugs just like a zero projection hides all
    assert changed == ["1.weight", "1.bias", "2.weight", "2.bias"]
    for name, p in model.named_parameters():
        if name in changed:
            assert len(torch.unique(p.detach())) == p.numel(), name
        else:
            assert torch.equal(p, before[name]), name
    # zero-init is no longer zero output: the comparison is live
    assert model(torch.randn(2, 4, dtype=torch.float64)).abs().max() > 0


def test_perturbation_is_identical_for_identical_generators() -> None:
    a, b = _model(), _model()
    perturb_degenerate_(a, torch.Generator().manual_seed(7))
    perturb_degenerate_(b, torch.Generator().manual_seed(7))
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), na  # every rank draws the same perturbation


def test_perturbation_keeps_the_dtype_and_scales_with_fan_in() -> None:
    lin = nn.Linear(256, 4).to(torch.float32)
    nn.init.zeros_(lin.weight)
    perturb_degenerate_(lin, torch.Generator().manual_seed(0))
    assert lin.weight.dtype == torch.float32
    assert 0.03 < float(lin.weight.detach().std()) < 0.1  # ~ 1/sqrt(256)


def _holder(**params: torch.Tensor) -> nn.Module:
    module = nn.Module()
    for name, value in params.items():
        module.register_parameter(name, nn.Parameter(value))
    return module


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
def test_a_zero_scalar_gate_is_perturbed(shape: tuple[int, ...]) -> None:
    # a zero-initialised gate (one element) silences its whole branch: 0 == 0 passes
    module = _holder(gate=torch.zeros(shape, dtype=torch.float64))
    assert perturb_degenerate_(module, torch.Generator().manual_seed(0)) == ["gate"]
    gate = module.get_parameter("gate")
    assert gate.shape == shape and float(gate.detach().reshape(())) != 0.0


def test_a_nonzero_scalar_is_not_degenerate() -> None:
    # one element is trivially "all equal": only zero makes it vacuous
    module = _holder(temperature=torch.full((1,), 0.7), scale=torch.full((), -2.0))
    assert perturb_degenerate_(module, torch.Generator().manual_seed(0)) == []
    assert float(module.get_parameter("temperature").detach()) == pytest.approx(0.7)
    assert float(module.get_parameter("scale").detach()) == -2.0


@pytest.mark.parametrize(
    ("shape", "fill", "std"),
    [((5,), 1.0, 0.5), ((3, 16), 1.0, 1 / 4), ((2, 4, 16), -1.0, 1 / 8), ((1, 1), 0.0, 1.0)],
)
def test_noise_is_drawn_from_the_generator_with_std_by_fan_in(
    shape: tuple[int, ...], fill: float, std: float,
) -> None:
    # vectors 0.5; matrices and up 1/sqrt(prod(shape[1:])), added in the parameter's dtype
    start = torch.full(shape, fill, dtype=torch.float32)
    module = _holder(w=start.clone())
    assert perturb_degenerate_(module, torch.Generator().manual_seed(3)) == ["w"]
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    expected = start + (noise * std).to(torch.float32)
    assert torch.equal(module.get_parameter("w").detach(), expected)


def test_empty_and_dtensor_parameters_are_left_alone() -> None:
    sharded = nn.Parameter(FakeDTensor(torch.zeros(2), (Shard(0),), global_shape=(4,)))
    sharded._local, sharded.placements = torch.zeros(2), (Shard(0),)  # lost by Parameter()
    module = _holder(empty=torch.zeros(0, 3))
    module.register_parameter("sharded", sharded)
    module.register_parameter("zero", nn.Parameter(torch.zeros(3)))  # after them: still seen
    assert perturb_degenerate_(module, torch.Generator().manual_seed(0)) == ["zero"]


@pytest.mark.parametrize("values", [[5.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 5.0]])
def test_one_different_element_anywhere_makes_a_parameter_live(values: list[float]) -> None:
    module = _holder(w=torch.tensor(values))
    assert perturb_degenerate_(module, torch.Generator().manual_seed(0)) == []
    assert module.get_parameter("w").detach().tolist() == values


def test_grad_problems_catch_missing_zero_and_nonfinite() -> None:
    out = grad_problems({
        "none": None,
        "zero": torch.zeros(3),
        "nan": torch.tensor([1.0, float("nan")]),
        "inf": torch.tensor([1.0, float("inf")]),  # +inf alone: max abs would look "live"
        "fine": torch.tensor([0.0, 1.0]),
        "masked": torch.zeros(2),
    }, allow_zero={"masked": "fully masked rows have no gradient"})
    assert [p.split(":")[0] for p in out.problems] == ["none", "zero", "nan", "inf"]
    assert "inf: 1 non-finite elements" in out.problems
    assert "masked: all zero, allowed: fully masked rows have no gradient" in out.lines
    with pytest.raises(VacuousError) as info:
        assert_grads_nonzero_finite({"w": torch.zeros(2)})
    assert info.value.check == "nonzero" and check_of(info.value) == "nonzero"
    assert str(info.value) == "nonzero: w: all zero (vacuous: 0 == 0 passes)"
    assert assert_grads_nonzero_finite({"w": torch.ones(2)}).lines == ["w: max abs 1"]
    with pytest.raises(VacuousError) as info:
        assert_grads_nonzero_finite({"a": None, "b": torch.zeros(1)})
    assert str(info.value) == ("nonzero: a: no gradient (not connected to the output?); "
                               "b: all zero (vacuous: 0 == 0 passes)")
    allowed = assert_grads_nonzero_finite({"m": torch.zeros(1)}, allow_zero={"m": "masked"})
    assert allowed.lines == ["m: all zero, allowed: masked"]


def test_a_dtensor_grad_is_judged_by_its_full_value() -> None:
    # a pad-only shard is all zero on this rank; the global grad is live
    padded = FakeDTensor(torch.zeros(2), (Shard(0),), full=torch.tensor([0.0, 0.0, 3.0]))
    # a shard that looks fine here, while another rank's shard holds an inf
    poisoned = FakeDTensor(torch.ones(2), (Shard(0),), full=torch.tensor([1.0, float("inf")]))
    out = grad_problems({"padded": padded, "poisoned": poisoned})
    assert out.lines == ["padded: max abs 3"]
    assert out.problems == ["poisoned: 1 non-finite elements"]


def test_parity_error_is_an_assertion_error_naming_its_checks() -> None:
    err = ParityError("output", "boom", failed=["output", "param_grad"])
    assert isinstance(err, AssertionError)
    assert (err.check, err.failed) == ("output", ("output", "param_grad"))
    assert set(err.failed) <= set(CHECKS)
    assert check_of(RuntimeError()) == "error:RuntimeError"


# --------------------------------------------------------------------------------------
# odd input: a failure of the check it was given to, never an internal error


class _NoItems:
    """Neither a mapping nor anything a check can read."""


@pytest.mark.parametrize(("check", "call"), [
    ("sharding_active", lambda: assert_sharding_active(_NoItems(), FakeMesh((1, 2)))),
    ("replicated_identical",
     lambda: assert_replicated_identical(_NoItems(), FakeMesh((1, 1)))),
    ("replicated_identical", lambda: replicated_problems(_NoItems(), FakeMesh((1, 2)))),
    ("nonzero", lambda: grad_problems(_NoItems())),
    # a bool "grad": finite, but abs() is not defined for bool tensors
    ("nonzero", lambda: assert_grads_nonzero_finite({"g": torch.ones(2, dtype=torch.bool)})),
    ("nonzero", lambda: perturb_degenerate_(_NoItems(), torch.Generator())),  # type: ignore[arg-type]
])
def test_odd_input_fails_the_check_it_was_given_to(check: str, call: Any) -> None:
    with pytest.raises(ParityError, match="cannot judge the values given") as info:
        call()
    assert info.value.check == check
    assert f"{check}: cannot judge" in str(info.value)
