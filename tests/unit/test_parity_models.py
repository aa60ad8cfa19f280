"""check_parity on what real models keep (issue 22), on a 1x1 cell without a process group.

Each test names the finding of issue 22 it closes. The multi-rank versions (a llama-style
model with a complex RoPE table, TP/SP, FSDP2, loss parallel) run through the real CLI in
``tests/worlds/test_parity_real_models.py``; these are the fast, single-process ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from cpmatrix.parity import ParityError, TensorSpec, Tolerance, check_parity, tolerance_for
from cpmatrix.parity._inputs import Inputs
from cpmatrix.parity._step import run_cp
from fake_mesh import FakeMesh

DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16}


class Lin(nn.Linear):
    """``nn.Linear`` whose input is called ``x``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


def _cell(dtype: str = "fp64", autocast: bool = False) -> Any:
    records: dict[str, Any] = {}
    return SimpleNamespace(
        dtype=DTYPES[dtype], autocast=autocast, path="reference", device=torch.device("cpu"),
        generator=torch.Generator().manual_seed(0), mesh=FakeMesh((1, 1)), rank=0,
        world_size=1, seed=0, mutant=None, record=records.__setitem__, records=records)


def _fails(fn: Any) -> ParityError:
    with pytest.raises(ParityError) as info:
        fn()
    return info.value


# --------------------------------------------------------------------------------------
# finding 1: a complex buffer is never cast to real


class Rotary(nn.Module):
    """Rotates channel pairs by a complex64 table (llama's RoPE, in miniature)."""

    def __init__(self, conjugate: bool = False, persistent: bool = False) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        angles = torch.arange(6, dtype=torch.float32).outer(torch.tensor([1.0, 0.3]))
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles),
                             persistent=persistent)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        self.conjugate = conjugate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        table = self.freqs_cis.conj() if self.conjugate else self.freqs_cis
        h = self.proj(x)
        pairs = torch.view_as_complex(h.to(table.real.dtype).reshape(6, 2, 2))
        return torch.view_as_real(pairs * table).flatten(1).to(h.dtype)


@pytest.mark.parametrize("dtype", ["fp64", "fp32"])
def test_a_complex_buffer_keeps_a_complex_dtype_of_the_cells_precision(dtype: str) -> None:
    cell = _cell(dtype)
    serial, cp = Rotary(), Rotary()
    check_parity(cell, serial, cp, inputs={"x": TensorSpec(shape=(6, 4))},
                 placements={"x": None})
    want = torch.complex128 if dtype == "fp64" else torch.complex64
    assert serial.freqs_cis.dtype == cp.freqs_cis.dtype == want
    assert serial.steps.dtype == torch.int64  # integer buffers untouched
    setup = cell.records["parity.check.setup"]
    assert f"buffer freqs_cis: torch.complex64 -> {want}" in setup
    assert "buffer steps: torch.int64 (left alone)" in setup


def test_a_conjugated_rope_on_the_cp_side_fails_output() -> None:
    # with the table cast to real (Module.to), conj() is a no-op and this passed
    exc = _fails(lambda: check_parity(
        _cell(), Rotary(), Rotary(conjugate=True), inputs={"x": TensorSpec(shape=(6, 4))},
        placements={"x": None}))
    assert exc.check == "output"


class RealRotary(Rotary):
    """The CP side declares the table real: loading a complex one discards its phase."""

    def __init__(self) -> None:
        super().__init__(persistent=True)
        self.freqs_cis = self.freqs_cis.real.clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


@pytest.mark.parametrize("attempt", [1, 2])  # torch warns once per process: set_warn_always
def test_a_discarded_imaginary_part_fails_setup_every_time(attempt: int) -> None:
    exc = _fails(lambda: check_parity(
        _cell(), Rotary(persistent=True), RealRotary(), inputs={"x": TensorSpec(shape=(6, 4))},
        placements={"x": None}))
    assert exc.check == "setup"
    assert "discarding its imaginary part" in str(exc)
    assert not torch.is_warn_always_enabled()  # restored


def test_warnings_of_either_side_are_recorded_not_lost() -> None:
    class Noisy(Lin):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            warnings.warn("this path is deprecated", DeprecationWarning, stacklevel=1)
            return super().forward(x)

    cell = _cell()
    check_parity(cell, Lin(3, 3), Noisy(3, 3), inputs={"x": TensorSpec(shape=(2, 3))},
                 placements={"x": None})
    assert cell.records["parity.warnings"] == "DeprecationWarning: this path is deprecated"
    assert "warning: DeprecationWarning: this path is deprecated" in (
        cell.records["parity.check.setup"])


# --------------------------------------------------------------------------------------
# finding 2: buffers are compared


class RunningMean(nn.Module):
    """A BatchNorm-like running mean; ``rows`` < all: the bug of local statistics."""

    def __init__(self, rows: int | None = None) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("running_mean", torch.zeros(3))
        self.register_buffer("num_batches_tracked", torch.zeros((), dtype=torch.int64))
        self.rows = rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        with torch.no_grad():
            seen = h[: self.rows] if self.rows else h
            self.running_mean.mul_(0.9).add_(0.1 * seen.mean(0))
            self.num_batches_tracked += 1
        return h - self.running_mean


@pytest.mark.parametrize("dtype", ["fp64", "fp32", "bf16"])
def test_running_statistics_from_local_rows_fail_the_buffer_check(dtype: str) -> None:
    cell = _cell(dtype)
    check_parity(cell, RunningMean(), RunningMean(), inputs={"x": TensorSpec(shape=(8, 3))},
                 placements={"x": None})
    assert cell.records["parity.check.buffer"].startswith("ok: 2 tensors within tolerance")
    exc = _fails(lambda: check_parity(
        _cell(dtype), RunningMean(), RunningMean(rows=4), inputs={"x": TensorSpec(shape=(8, 3))},
        placements={"x": None}))
    assert "buffer" in exc.failed
    assert "running_mean: max abs" in str(exc)


def test_buffers_are_compared_after_every_training_step() -> None:
    cell = _cell()
    exc = _fails(lambda: check_parity(
        cell, RunningMean(), RunningMean(rows=4), inputs={"x": TensorSpec(shape=(8, 3))},
        placements={"x": None}, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), steps=2))
    assert "buffer" in exc.failed
    assert "step 0: running_mean" in str(exc) and "step 1: running_mean" in str(exc)


def test_a_model_without_buffers_skips_the_buffer_check() -> None:
    cell = _cell()
    check_parity(cell, Lin(2, 2), Lin(2, 2), inputs={"x": TensorSpec(shape=(3, 2))},
                 placements={"x": None})
    assert cell.records["parity.check.buffer"] == "skipped: the model keeps no buffers"


# --------------------------------------------------------------------------------------
# finding 3: tensors inside nested inputs and outputs


@dataclasses.dataclass
class Pair:
    left: torch.Tensor
    right: torch.Tensor
    scale: float = 1.0


def _nested(wrong: float = 1.0) -> Any:
    def model(xs: list[torch.Tensor], feats: dict[str, Any], pair: Pair) -> dict[str, Any]:
        a = xs[0] * 2 + _Scaled.apply(xs[1], wrong)
        return {"sum": a * feats["w"] + pair.left * pair.scale,
                "parts": Pair(left=pair.right.sin(), right=a)}
    return model


class _Scaled(torch.autograd.Function):
    """Identity forward; backward scaled by ``k`` (k != 1: a wrong grad, right forward)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, k: float) -> torch.Tensor:
        ctx.k = k
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return grad * ctx.k, None


def _nested_inputs() -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    return {"xs": [torch.randn(4, generator=g, dtype=torch.float64) for _ in range(2)],
            "feats": {"w": TensorSpec(shape=(4,)), "n": 3},
            "pair": Pair(left=torch.ones(4, dtype=torch.float64),
                         right=torch.arange(4.0, dtype=torch.float64), scale=0.5)}


def test_tensors_inside_nested_inputs_are_inputs_with_their_own_grads() -> None:
    cell = _cell()
    report = check_parity(cell, _nested(), _nested(), inputs=_nested_inputs(),
                          placements={"xs": None, "feats": None, "pair.left": None,
                                      "pair.right": None})
    names = {d.name for d in report.diffs}
    assert {"xs.0", "xs.1", "feats.w", "pair.left", "pair.right"} <= names  # input grads
    assert {"out.sum", "out.parts.left", "out.parts.right"} <= names  # nested outputs


def test_a_wrong_grad_of_a_tensor_inside_a_list_fails_input_grad() -> None:
    exc = _fails(lambda: check_parity(
        _cell(), _nested(), _nested(wrong=3.0), inputs=_nested_inputs(),
        placements={"xs": None, "feats": None, "pair": None}))
    assert exc.failed == ("input_grad",)
    assert "xs.1: max abs" in str(exc) and "xs.0" not in str(exc).split("input_grad:")[-1]
    assert "CP = 3 x serial everywhere" in str(exc)


def test_each_side_gets_its_own_copy_of_a_nested_tensor() -> None:
    seen: dict[str, Any] = {}

    def side(name: str) -> Any:
        def model(batch: dict[str, torch.Tensor]) -> torch.Tensor:
            seen[name] = batch["x"]
            return batch["x"] * 2
        return model

    check_parity(_cell(), side("serial"), side("cp"), inputs={"batch": {"x": TensorSpec(
        shape=(3,))}}, placements={"batch": None})
    assert seen["serial"] is not seen["cp"]
    assert torch.equal(seen["serial"], seen["cp"])


def test_placements_for_a_path_that_does_not_exist_fail_setup() -> None:
    exc = _fails(lambda: check_parity(
        _cell(), _nested(), _nested(), inputs=_nested_inputs(), placements={"xs.7": None}))
    assert exc.check == "setup" and "placements for unknown inputs ['xs.7']" in str(exc)


# --------------------------------------------------------------------------------------
# findings 4 and 5: tolerances that scale with the computation (the fp64 twin)


def _softmax_halves(x: torch.Tensor) -> torch.Tensor:
    """The bug of a sharded softmax without its all-reduce: each half normalized alone."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a.softmax(-1), b.softmax(-1)], dim=-1)


def _softmax_in_two(x: torch.Tensor) -> torch.Tensor:
    """A correct two-shard softmax: max and sum reduced over both halves (in fp32)."""
    a, b = x.float().chunk(2, dim=-1)
    m = torch.maximum(a.amax(-1, keepdim=True), b.amax(-1, keepdim=True))
    ea, eb = (a - m).exp(), (b - m).exp()
    total = ea.sum(-1, keepdim=True) + eb.sum(-1, keepdim=True)
    return torch.cat([ea / total, eb / total], dim=-1).to(x.dtype)


def test_an_8192_long_bf16_softmax_without_its_all_reduce_fails() -> None:
    inputs = {"x": TensorSpec(shape=(2, 8192))}
    exc = _fails(lambda: check_parity(_cell("bf16"), lambda x: x.softmax(-1), _softmax_halves,
                                      inputs=inputs, placements={"x": None}))
    assert exc.failed[0] == "output"
    assert "|cp - twin|" in str(exc)
    # the fixed bf16 row (atol 0.016, above every value of such a row) passes the bug
    fixed = tolerance_for("bf16").loosen(atol=0.016, reason="the old fixed bf16 row")
    check_parity(_cell("bf16"), lambda x: x.softmax(-1), _softmax_halves, inputs=inputs,
                 placements={"x": None}, tolerance=fixed)
    cell = _cell("bf16")
    check_parity(cell, lambda x: x.softmax(-1), _softmax_in_two, inputs=inputs,
                 placements={"x": None})
    assert cell.records["parity.twin"].startswith("ran")
    assert cell.records["parity.judged_by"] == "twin: 2 tensors"


def _cancelling_sum(order: str) -> Any:
    """``sum_t w * x_t`` over 128 tokens whose terms cancel; two summation orders."""
    def model(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        terms = x * w
        if order == "chunks":  # four partial sums, then their sum (a sharded reduction)
            return torch.stack([c.sum(0) for c in terms.chunk(4, dim=0)]).sum(0)
        return terms.sum(0)
    return model


def test_a_cancelling_fp32_sum_in_another_order_passes_the_twin_not_the_fixed_row() -> None:
    # 64 pairs of terms +-1000 r that cancel, plus 1e-2 of signal: sums of ~0.5
    g = torch.Generator().manual_seed(3)
    r = torch.randn(64, 64, generator=g, dtype=torch.float64)
    signal = torch.randn(128, 64, generator=g, dtype=torch.float64) * 1e-2
    x = torch.cat([1000 * r, -1000 * r]) + signal
    x = x[torch.randperm(128, generator=g)].float()
    inputs = {"x": TensorSpec.of(x, requires_grad=False), "w": TensorSpec(shape=(64,))}
    cell = _cell("fp32")
    check_parity(cell, _cancelling_sum("one"), _cancelling_sum("chunks"), inputs=inputs,
                 placements={"x": None, "w": None})
    fixed = tolerance_for("fp32").loosen(atol=1e-5, reason="the old fixed fp32 row")
    exc = _fails(lambda: check_parity(
        _cell("fp32"), _cancelling_sum("one"), _cancelling_sum("chunks"), inputs=inputs,
        placements={"x": None, "w": None}, tolerance=fixed))
    assert exc.check == "output"


def test_fp64_cells_use_the_fixed_table_and_say_so() -> None:
    cell = _cell("fp64")
    check_parity(cell, Lin(2, 2), Lin(2, 2), inputs={"x": TensorSpec(shape=(3, 2))},
                 placements={"x": None})
    assert cell.records["parity.twin"].startswith("none: a fixed tolerance")
    assert "judged_by" not in {k.split(".", 1)[1] for k in cell.records}


def test_a_serial_side_that_cannot_run_in_fp64_falls_back_to_the_table_labelled() -> None:
    def serial(x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float64:
            raise RuntimeError("no float64 kernel for this op")
        return x * 2

    cell = _cell("fp32")
    check_parity(cell, serial, lambda x: x * 2, inputs={"x": TensorSpec(shape=(3,))},
                 placements={"x": None})
    assert cell.records["parity.twin"] == (
        "could not run, the fixed table judged instead: the serial side does not run in "
        "float64 (RuntimeError: no float64 kernel for this op)")
    assert cell.records["parity.judged_by"] == "table: 2 tensors"


def test_the_twin_does_not_move_the_global_rng() -> None:
    def noisy(x: torch.Tensor) -> torch.Tensor:  # draws from the global RNG, as dropout does
        return x + 0 * torch.rand(x.shape, dtype=x.dtype)

    states = []
    for tolerance in (None, Tolerance(rtol=0.0, atol=0.0)):  # with the twin, and without
        torch.manual_seed(5)
        check_parity(_cell("fp32"), noisy, noisy, inputs={"x": TensorSpec(shape=(4,))},
                     placements={"x": None}, tolerance=tolerance)
        states.append(torch.get_rng_state())
    assert torch.equal(states[0], states[1])


# --------------------------------------------------------------------------------------
# finding 6: a context around the CP side's whole step


def test_the_context_covers_the_cp_forward_and_backward_only() -> None:
    log: list[str] = []

    @contextlib.contextmanager
    def ctx() -> Iterator[None]:
        log.append("enter")
        yield
        log.append("exit")

    class Side(Lin):
        def __init__(self, name: str) -> None:
            super().__init__(2, 2)
            self.name = name
            self.weight.register_hook(lambda g: log.append(f"{self.name} backward") or g)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            log.append(f"{self.name} forward")
            return super().forward(x)

    check_parity(_cell(), Side("serial"), Side("cp"), inputs={"x": TensorSpec(shape=(3, 2))},
                 placements={"x": None}, context=ctx)
    assert log == ["serial forward", "serial backward", "enter", "cp forward", "cp backward",
                   "exit"]


def test_a_context_may_take_the_cp_inputs_of_the_step() -> None:
    got: list[Any] = []

    def ctx(inputs: dict[str, Any]) -> contextlib.AbstractContextManager[None]:
        got.append(inputs["x"])
        return contextlib.nullcontext()

    check_parity(_cell(), Lin(2, 2), Lin(2, 2), inputs={"x": TensorSpec(
        shape=(3, 2))}, placements={"x": None}, context=ctx,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), steps=2)
    assert len(got) == 2 and all(t.shape == (3, 2) for t in got)


@pytest.mark.parametrize("context", [contextlib.nullcontext(), 3, lambda: 3])
def test_a_context_that_is_not_a_factory_of_one_fails_setup(context: Any) -> None:
    exc = _fails(lambda: check_parity(
        _cell(), Lin(2, 2), Lin(2, 2), inputs={"x": TensorSpec(shape=(3, 2))},
        placements={"x": None}, context=context))
    assert exc.check == "setup" and "context" in str(exc)


# --------------------------------------------------------------------------------------
# finding 8: messages


def test_a_wrong_output_shape_is_one_line_and_the_grad_checks_say_why_they_skipped() -> None:
    cell = _cell()
    exc = _fails(lambda: check_parity(
        cell, Lin(4, 4), Lin(4, 4), inputs={"x": TensorSpec(shape=(5, 4))},
        placements={"x": None}, prepare_cp=lambda m, mesh: _Narrow(m)))
    assert exc.failed == ("output",)
    assert "out: shape (5, 2) != serial (5, 4)" in str(exc)
    assert "missing" not in str(exc) and "max abs inf" not in str(exc)
    for check in ("input_grad", "param_grad"):
        assert cell.records[f"parity.check.{check}"].startswith(
            "skipped: no CP backward ran: the CP output's shape is wrong")


class _Narrow(nn.Module):
    def __init__(self, inner: Lin) -> None:
        super().__init__()
        self.weight, self.bias = inner.weight, inner.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias)[:, :2]


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.out = nn.Linear(3, 5, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(tokens))


def test_weights_untied_by_prepare_cp_are_named_as_tied() -> None:
    def untie(m: nn.Module, mesh: Any) -> nn.Module:
        model: Any = m
        model.out.weight = nn.Parameter(model.emb.weight.detach().clone())
        return m

    tokens = torch.tensor([[0, 3, 4]])
    exc = _fails(lambda: check_parity(
        _cell(), Tied(), Tied(), inputs={"tokens": TensorSpec.of(tokens)},
        placements={"tokens": None}, prepare_cp=untie))
    assert exc.check == "setup"
    assert "tied weights untied: emb.weight and out.weight are one parameter in serial" in str(exc)
    check_parity(_cell(), Tied(), Tied(), inputs={"tokens": TensorSpec.of(tokens)},
                 placements={"tokens": None})


def test_an_error_of_the_cp_side_names_inputs_given_the_default_placement() -> None:
    def cp(tokens: torch.Tensor) -> torch.Tensor:
        raise TypeError("mixed torch.Tensor and DTensor")

    # (a replicated DTensor needs a real mesh: the world test shows it through the CLI)
    ins = Inputs(cp={"tokens": torch.tensor([1, 2])}, defaulted=["tokens"])
    with pytest.raises(TypeError) as info:  # the model's own error, unchanged in type
        run_cp(cp, ins)
    note = "\n".join(info.value.__notes__)
    assert "got input ['tokens'] as a replicated DTensor" in note
    assert "placements={'tokens': None}" in note


def test_no_differentiable_input_says_so_plainly() -> None:
    cell = _cell()
    check_parity(cell, Tied(), Tied(), inputs={"tokens": TensorSpec.of(torch.tensor([[1, 2]]))},
                 placements={"tokens": None})
    assert cell.records["parity.check.input_grad"] == (
        "skipped: no input takes a gradient (only integer inputs, requires_grad=False, or none)")


def test_warnings_of_the_twin_are_not_the_models() -> None:
    class WarnsInFloat64(Lin):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.dtype == torch.float64:  # only the toolkit's own fp64 run takes this path
                warnings.warn("Casting complex values to real discards the imaginary part",
                              UserWarning, stacklevel=1)
            return super().forward(x)

    for optimizer in (None, lambda ps: torch.optim.SGD(ps, lr=0.1)):
        cell = _cell("fp32")
        check_parity(cell, WarnsInFloat64(2, 2), Lin(2, 2),
                     inputs={"x": TensorSpec(shape=(3, 2))}, placements={"x": None},
                     optimizer=optimizer, steps=1)
        assert "parity.warnings" not in cell.records
        assert cell.records["parity.twin"].startswith("ran")
