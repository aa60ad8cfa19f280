"""Dtype-path probes: what a Function/module really computes in, recompute pass included."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import CheckpointError, checkpoint

from cpmatrix.parity import (
    DtypePathError,
    DtypeProbe,
    assert_autocast_off,
    assert_autocast_on,
    expected_compute_dtype,
)


class Scale(torch.autograd.Function):
    """x @ w; planted bug ``hidden_fp32``: the fp64 path computes in fp32 and casts back."""

    hidden_fp32 = False

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        if Scale.hidden_fp32:
            return (x.float() @ w.float()).to(x.dtype)
        return x @ w

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        x, w = ctx.saved_tensors
        return g @ w.T, x.T @ g


def _run(fn: Any, x: torch.Tensor, **ckpt: Any) -> None:
    y = checkpoint(fn, x, use_reentrant=False, **ckpt)
    y.float().backward(torch.randn(y.shape))


def test_module_forward_and_recompute_are_both_seen_by_the_pre_hook() -> None:
    lin = nn.Linear(4, 4).double()
    with DtypeProbe(ops=True) as probe:
        probe.watch(lin, "lin")
        _run(lambda t: torch.tanh(lin(t)), torch.randn(3, 4, dtype=torch.float64))
    assert [e.phase for e in probe.events_for("lin")] == ["forward", "recompute"]
    lines = assert_autocast_off(probe, "lin", torch.float64, require_recompute=True)
    assert lines == ["lin forward: ['torch.float64']", "lin recompute: ['torch.float64']"]
    assert not lin._forward_pre_hooks  # hooks removed on exit


def test_autocast_on_computes_in_the_cells_dtype_in_both_passes() -> None:
    lin = nn.Linear(4, 4)  # fp32 master weights; the cell says bf16 + autocast on
    with DtypeProbe(ops=True) as probe, torch.autocast("cpu", dtype=torch.bfloat16):
        probe.watch(lin, "lin")
        _run(lambda t: torch.tanh(lin(t)), torch.randn(3, 4))
    assert_autocast_on(probe, "lin", dtype=torch.float32, require_recompute=True)
    assert probe.events_for("lin")[1].compute_dtypes() == {torch.bfloat16}


def test_recompute_without_autocast_is_caught() -> None:
    # Planted bug: the recompute pass runs with autocast off (a custom context_fn), so the
    # saved activations of forward and recompute differ in dtype. Forward alone looks fine.
    lin = nn.Linear(4, 4)

    def contexts() -> tuple[Any, Any]:
        return contextlib.nullcontext(), torch.autocast("cpu", enabled=False)

    with DtypeProbe(ops=True) as probe, torch.autocast("cpu", dtype=torch.bfloat16):
        probe.watch(lin, "lin")
        with contextlib.suppress(CheckpointError):  # torch notices the metadata change too
            _run(lambda t: torch.tanh(lin(t)), torch.randn(3, 4), context_fn=contexts)
    forward_only = [e for e in probe.events_for("lin") if e.phase == "forward"]
    assert forward_only and all(e.autocast for e in forward_only)
    with pytest.raises(DtypePathError, match="recompute ran with autocast OFF") as info:
        assert_autocast_on(probe, "lin", require_recompute=True)
    assert info.value.check == "dtype_path"


def test_hidden_fp32_cast_inside_a_function_is_caught_only_by_the_op_probe() -> None:
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    Scale.hidden_fp32 = True
    try:
        with DtypeProbe(ops=True) as probe:
            probe.watch_function(Scale)
            _run(lambda t: Scale.apply(t, w), x)
        with DtypeProbe(ops=False) as inputs_only:
            inputs_only.watch_function(Scale)
            Scale.apply(x, w)
    finally:
        Scale.hidden_fp32 = False
    # the inputs are fp64, so a probe on inputs alone is fooled ...
    assert_autocast_off(inputs_only, "Scale", torch.float64)
    # ... the ops inside ran in fp32
    with pytest.raises(DtypePathError, match=r"ops inside ran in \['torch.float32'\]"):
        assert_autocast_off(probe, "Scale", torch.float64, require_recompute=True)
    assert [e.phase for e in probe.events_for("Scale")] == ["forward", "recompute"]
    assert "forward" in Scale.__dict__ and isinstance(Scale.__dict__["forward"], staticmethod)


def test_correct_function_passes_and_never_running_is_vacuous() -> None:
    w = torch.randn(3, 2, dtype=torch.float64)
    with DtypeProbe(ops=True) as probe:
        probe.watch_function(Scale)
        Scale.apply(torch.randn(5, 3, dtype=torch.float64), w)
    assert assert_autocast_off(probe, "Scale", torch.float64)
    with pytest.raises(DtypePathError, match="never ran"):
        assert_autocast_off(probe, "Other", torch.float64)
    with pytest.raises(DtypePathError, match="no recompute pass"):
        assert_autocast_off(probe, "Scale", torch.float64, require_recompute=True)


@pytest.mark.parametrize(
    ("dtype", "autocast", "expected"),
    [
        (torch.float64, False, torch.float64),
        (torch.float64, True, torch.float64),  # autocast never touches fp64
        (torch.float32, True, torch.bfloat16),  # CPU autocast default
        (torch.bfloat16, True, torch.bfloat16),
        (torch.float32, False, torch.float32),
    ],
)
def test_expected_compute_dtype(dtype: torch.dtype, autocast: bool, expected: torch.dtype) -> None:
    assert expected_compute_dtype(dtype, autocast) == expected
