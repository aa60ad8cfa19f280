"""Issue 31: the second serial sample (:mod:`cpmatrix.parity._second`).

The serial side runs again in its own precision with its rows split into interleaved
chunks, where the fp64 twin shows the split is an equivalent order. Real modules on CPU,
no world: the CP side's part (how many row shards) is in
tests/worlds/test_parity_flip_worlds.py.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from torch import nn

from cpmatrix.parity._second import _chunks, attach, needs_second, second_sample
from cpmatrix.parity._twin import Twin, make_twin, upcast_inputs
from cpmatrix.parity.compare import Probed
from cpmatrix.parity.trees import flatten


class _Counting(nn.Linear):
    """A linear layer that counts its calls in a buffer (state a split run, two calls,
    must not move)."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__(d_in, d_out)
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x = input
        self.seen += 1
        return super().forward(x)


class _Centered(nn.Linear):
    """Rows not independent: each output row depends on the batch mean."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x = input
        return super().forward(x - x.mean(0, keepdim=True))


def _step(module: nn.Module, dtype: torch.dtype, rows: int = 16, seed: int = 0,
          ) -> tuple[dict[str, Any], dict[str, Any], dict[str, torch.Tensor], Twin,
                     dict[str, torch.Tensor]]:
    """The serial step and its twin as check_parity runs them: (inputs, outputs,
    grad_outputs, twin, buffers before the serial run)."""
    torch.manual_seed(seed)
    twin = make_twin(module)
    module.to(dtype)
    start = {n: b.clone() for n, b in module.named_buffers()}
    x = torch.randn(rows, module.in_features, dtype=dtype, requires_grad=True)  # type: ignore[arg-type]
    ins = {"input": x}
    out = dict(flatten(module(**ins)))
    grads = {"out": torch.randn(out["out"].shape, dtype=dtype)}
    torch.autograd.backward([out["out"]], [grads["out"]])
    t_ins, t_leaves = upcast_inputs(ins, ["input"])
    t_out = dict(flatten(twin.module(**t_ins)))
    torch.autograd.backward([t_out["out"]], [grads["out"].double()])
    twin.outputs = {"out": t_out["out"].detach()}
    twin.input_grads = {"input": t_leaves["input"].grad}
    twin.param_grads = {n: p.grad for n, p in twin.module.named_parameters()}
    return ins, out, grads, twin, start


def test_the_sample_is_the_same_step_in_another_order_and_moves_nothing() -> None:
    serial = _Counting(8, 1)
    ins, out, grads, twin, start = _step(serial, torch.bfloat16)
    kept = {n: p.grad for n, p in serial.named_parameters()}
    kept_values = {n: g.clone() for n, g in kept.items() if g is not None}
    seen, twin_seen = serial.seen.clone(), twin.module.seen.clone()
    sample = second_sample(serial, start, ins, ["input"], out, grads, twin, 2,
                           contextlib.nullcontext)
    assert sample.values is not None, sample.why
    assert sample.chunks == 2 and "2 interleaved chunks" in sample.line()
    outs, in_grads, p_grads = sample.values
    t = twin.param_grads["bias"]
    # another order of the same sum: near the twin, in bf16 (a bias grad is a sum of rows)
    assert float((p_grads["bias"] - t).abs().max()) <= 0.05 * float(t.abs().max()) + 0.05
    assert p_grads["bias"].dtype == torch.float64 and outs["out"].shape == (16, 1)
    assert in_grads["input"].shape == (16, 8)
    # the serial module's grads and buffers as they were (the grad checks read them next)
    for n, p in serial.named_parameters():
        assert p.grad is kept[n]
        assert torch.equal(p.grad, kept_values[n])
    assert torch.equal(serial.seen, seen)
    assert torch.equal(twin.module.seen, twin_seen)


def test_a_split_that_changes_the_fp64_result_gives_no_sample() -> None:
    serial = _Centered(8, 1)
    ins, out, grads, twin, start = _step(serial, torch.bfloat16)
    sample = second_sample(serial, start, ins, ["input"], out, grads, twin, 2,
                           contextlib.nullcontext)
    assert sample.values is None
    assert "rows are not independent" in sample.line(), sample.line()


def test_no_common_row_dim_no_sample_and_a_failing_split_is_no_failure() -> None:
    serial = nn.Linear(8, 1)
    ins, out, grads, twin, start = _step(serial, torch.float32)
    odd = {**ins, "input": ins["input"][:1]}  # one row: nothing to split
    sample = second_sample(serial, start, odd, ["input"], out, grads, twin, 2,
                           contextlib.nullcontext)
    assert sample.values is None and "no first dim" in sample.why

    def broken() -> Any:
        raise RuntimeError("autocast broke")
    sample = second_sample(serial, start, ins, ["input"], out, grads, twin, 2, broken)
    assert sample.values is None and "split run failed (RuntimeError" in sample.why


def test_attach_gives_each_twin_value_its_sample_and_keeps_its_probes() -> None:
    serial = nn.Linear(8, 3)
    ins, out, grads, twin, start = _step(serial, torch.bfloat16)
    probes = (twin.outputs["out"], twin.outputs["out"])
    twin.outputs = {"out": Probed(twin.outputs["out"], probes)}
    sample = second_sample(serial, start, ins, ["input"], out, grads, twin, 4,
                           contextlib.nullcontext)
    attach(twin, sample)
    out_twin = twin.outputs["out"]
    assert isinstance(out_twin, Probed) and out_twin.probes == probes
    assert out_twin.second is not None and out_twin.second.shape == (16, 3)
    bias = twin.param_grads["bias"]
    assert isinstance(bias, Probed) and bias.probes == () and bias.second is not None


def test_chunks_interleave_every_row_once() -> None:
    chunks = _chunks(7, 3)
    assert [c.tolist() for c in chunks] == [[0, 3, 6], [1, 4], [2, 5]]


@pytest.mark.parametrize(("shape", "needed"), [((3,), True), ((16,), False), ((0,), False)])
def test_needs_second_where_a_floating_tensor_is_tiny(shape: tuple[int], needed: bool) -> None:
    assert needs_second({"a": torch.zeros(shape), "b": torch.zeros(64)}) is needed
    assert needs_second({"ids": torch.zeros(shape, dtype=torch.int64)}) is False
