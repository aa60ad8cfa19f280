"""No check of the toolkit raises anything but a ParityError with a check name, on any input.

Odd values (non-tensors, empty, integer, bool and complex tensors, None grads, DTensors on
foreign meshes or with placements that do not fit, mappings that are not mappings) go to
every public check, world-free (fake meshes, a fake world, a 1x1 cell for ``check_parity``).
A check may pass or fail; if it fails, it is a ``ParityError`` whose ``.check`` names it.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.distributed.tensor import Partial, Replicate, Shard

from cpmatrix.parity import (
    CHECKS,
    DtypeProbe,
    ParityError,
    TensorSpec,
    assert_autocast_off,
    assert_autocast_on,
    assert_compute_dtype,
    assert_entropy,
    assert_grads_nonzero_finite,
    assert_replicated_identical,
    assert_sharding_active,
    check_parity,
    compare_named,
    perturb_degenerate_,
    tolerance_for,
)
from cpmatrix.parity import checks as checks_module
from fake_mesh import FakeDTensor, FakeMesh, FakeWorld

MESHES = [FakeMesh((1, 1)), FakeMesh((1, 2)), FakeMesh((2, 2), rank=3), FakeMesh((2, 1))]
WORLD = FakeMesh((4,), ("world",))  # a mesh over ranks the 1x2 cell does not have

tensors = st.one_of(
    st.sampled_from([torch.float64, torch.float32, torch.bfloat16, torch.int64, torch.int8,
                     torch.bool, torch.complex64]).flatmap(
        lambda dtype: st.lists(st.integers(0, 3), max_size=3).map(
            lambda shape: torch.zeros(shape, dtype=dtype) if dtype == torch.bool
            else torch.ones(shape, dtype=dtype))),
    st.just(torch.tensor([float("nan"), float("inf")])),
    st.just(torch.empty(0)),
)
placements = st.lists(
    st.sampled_from([Shard(0), Shard(1), Shard(5), Replicate(), Partial(), "S0", None, 3]),
    min_size=0, max_size=3,
)
dtensors = st.builds(  # full_tensor() of a real DTensor always answers: here its full value
    lambda local, places, mesh, full: FakeDTensor(
        local, places, mesh=mesh, full=local if full is None else full),
    tensors, placements,
    st.sampled_from([None, MESHES[2]["cp1"], MESHES[2].flatten(), WORLD,
                     FakeMesh((2,), ("w",), ranks=torch.tensor([0, 3]))]),
    st.one_of(st.none(), tensors),
)
values = st.one_of(st.none(), st.integers(), st.text(max_size=3), st.floats(), tensors,
                   dtensors, st.lists(st.integers(), max_size=2), st.just(object()))
named = st.one_of(
    st.dictionaries(st.text(max_size=4), values, max_size=4),
    st.lists(values, max_size=2),  # not a mapping
    values,
)


def only_parity_errors(fn: Callable[[], Any]) -> ParityError | None:
    """Run ``fn``; a failure must be a ParityError naming a known check."""
    try:
        fn()
    except ParityError as exc:
        assert exc.check in CHECKS, exc.check
        assert str(exc)
        return exc
    return None


FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(named, st.sampled_from(MESHES))
def test_sharding_active(values: Any, mesh: FakeMesh) -> None:
    exc = only_parity_errors(lambda: assert_sharding_active(values, mesh))
    assert exc is None or exc.check == "sharding_active"


@FAST
@given(named)
def test_replicated_identical_on_a_trivial_mesh(values: Any) -> None:
    exc = only_parity_errors(lambda: assert_replicated_identical(values, FakeMesh((1, 1))))
    assert exc is None or exc.check == "replicated_identical"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.text(max_size=3), values, max_size=3))
def test_replicated_identical_on_a_fake_world(values: dict[str, Any]) -> None:
    # every rank sends the same odd values (what a case does): only ParityErrors come back
    world = FakeWorld((1, 2))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checks_module, "dist", world)
        errors = world.run(lambda mesh: only_parity_errors(
            lambda: assert_replicated_identical(values, mesh)))
    assert all(e is None or e.check == "replicated_identical" for e in errors)


@FAST
@given(named)
def test_grads_nonzero_finite(grads: Any) -> None:
    exc = only_parity_errors(lambda: assert_grads_nonzero_finite(grads))
    assert exc is None or exc.check == "nonzero"


@FAST
@given(st.one_of(
    st.dictionaries(st.text(max_size=3), st.tuples(values, values), max_size=3),
    st.dictionaries(st.text(max_size=3), st.one_of(st.none(), st.integers(), tensors)),
    st.lists(values, max_size=2), values))
def test_compare_named(pairs: Any) -> None:
    only_parity_errors(lambda: compare_named(pairs, tolerance_for(torch.float64)))


@pytest.mark.parametrize("module", [None, 3, "lin", torch.nn.Linear(2, 2), torch.nn.Module()])
def test_perturb_degenerate(module: Any) -> None:
    only_parity_errors(lambda: perturb_degenerate_(module, torch.Generator()))


@FAST
@given(st.one_of(st.lists(st.dictionaries(st.sampled_from(["rank", "coords", "draws"]), values),
                          max_size=2), named),
       st.sampled_from([("cp0",), ("tp",), ()]))
def test_entropy(fingerprints: Any, sharded: tuple[str, ...]) -> None:
    exc = only_parity_errors(lambda: assert_entropy(fingerprints, sharded=sharded))
    assert exc is None or exc.check == "rng_entropy"


@pytest.mark.parametrize("probe", [None, "probe", DtypeProbe()])
@pytest.mark.parametrize("assertion", [
    lambda probe: assert_compute_dtype(probe, "lin", torch.float64),
    lambda probe: assert_autocast_off(probe, "lin", torch.float64),
    lambda probe: assert_autocast_on(probe, 3),
])
def test_dtype_paths(probe: Any, assertion: Callable[[Any], Any]) -> None:
    exc = only_parity_errors(lambda: assertion(probe))
    assert exc is not None and exc.check == "dtype_path"


# --------------------------------------------------------------------------------------
# check_parity on a 1x1 cell without a process group


def _cell() -> Any:
    return SimpleNamespace(
        dtype=torch.float64, autocast=False, path="reference", device=torch.device("cpu"),
        generator=torch.Generator().manual_seed(0), mesh=FakeMesh((1, 1)), rank=0,
        world_size=1, seed=0, mutant=None, record=lambda key, value: None)


def _model(**inputs: Any) -> torch.Tensor:
    """A model that uses whatever floating tensors it is given (its own code is fine)."""
    total = torch.zeros((), dtype=torch.float64)
    for value in inputs.values():
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not isinstance(
                value, FakeDTensor):
            total = total + value.double().sum()
    return total * torch.ones(2, dtype=torch.float64)


odd_inputs = st.dictionaries(
    st.sampled_from(["x", "y"]),
    st.one_of(values, st.builds(TensorSpec, shape=st.lists(st.integers(-1, 3), max_size=2)
                                .map(tuple))),
    max_size=2,
)
odd_placements = st.one_of(
    st.none(), st.dictionaries(st.sampled_from(["x", "y", "z"]), st.one_of(
        st.none(), placements, st.dictionaries(st.sampled_from(["cp0", "cp1", "tp"]),
                                               st.sampled_from([Shard(0), "R", 1])))),
    named,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(odd_inputs, odd_placements,
       st.sampled_from([None, "tight", 1e-3, tolerance_for(torch.float64)]),
       st.sampled_from([None, ("N", None), {"nope": (None,)}, 3]),
       st.sampled_from([None, {"out": "a reason"}, ["out"]]))
def test_check_parity(inputs: Any, places: Any, tolerance: Any, output_axes: Any,
                      allow_zero: Any) -> None:
    only_parity_errors(lambda: check_parity(
        _cell(), _model, _model, inputs=inputs, placements=places, tolerance=tolerance,
        output_axes=output_axes, allow_zero=allow_zero))


@pytest.mark.parametrize("steps", [0, -1, "3", 1.5])
def test_check_parity_training_steps(steps: Any) -> None:
    exc = only_parity_errors(lambda: check_parity(
        _cell(), torch.nn.Linear(2, 2), torch.nn.Linear(2, 2),
        inputs={"input": TensorSpec(shape=(3, 2))}, placements={"input": None},
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), steps=steps))
    assert exc is not None and exc.check == "setup"


@pytest.mark.parametrize("width", [4, 0])
def test_a_cp_output_of_the_wrong_shape_fails_output_not_backward(width: int) -> None:
    # both layers column-parallel: each rank returns only its columns. The grad_output is
    # drawn for the serial shape, so no backward fits the CP output: it is skipped, and
    # the output check (not autograd's RuntimeError) says why.
    weight = torch.randn(8, 8, dtype=torch.float64, requires_grad=True)
    exc = only_parity_errors(lambda: check_parity(
        _cell(), lambda x: x @ weight, lambda x: (x @ weight)[:, :width],
        inputs={"x": TensorSpec(shape=(5, 8))}, placements={"x": None}))
    assert exc is not None and exc.check == "output"
    assert f"shape (5, {width}) != serial (5, 8)" in str(exc)
