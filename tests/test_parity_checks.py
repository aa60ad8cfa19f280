"""Single-process parts of the anti-vacuous checks (the collective parts run in
tests/test_parity_worlds.py on real gloo worlds)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cpmatrix.parity import (
    CHECKS,
    ParityError,
    VacuousError,
    assert_grads_nonzero_finite,
    check_of,
    perturb_degenerate_,
)
from cpmatrix.parity.checks import grad_problems


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


def test_grad_problems_catch_missing_zero_and_nonfinite() -> None:
    out = grad_problems({
        "none": None,
        "zero": torch.zeros(3),
        "nan": torch.tensor([1.0, float("nan")]),
        "fine": torch.tensor([0.0, 1.0]),
        "masked": torch.zeros(2),
    }, allow_zero={"masked": "fully masked rows have no gradient"})
    assert [p.split(":")[0] for p in out.problems] == ["none", "zero", "nan"]
    assert "masked: all zero, allowed: fully masked rows have no gradient" in out.lines
    with pytest.raises(VacuousError) as info:
        assert_grads_nonzero_finite({"w": torch.zeros(2)})
    assert info.value.check == "nonzero" and check_of(info.value) == "nonzero"


def test_parity_error_is_an_assertion_error_naming_its_checks() -> None:
    err = ParityError("output", "boom", failed=["output", "param_grad"])
    assert isinstance(err, AssertionError)
    assert (err.check, err.failed) == ("output", ("output", "param_grad"))
    assert set(err.failed) <= set(CHECKS)
    assert check_of(RuntimeError()) == "error:RuntimeError"
