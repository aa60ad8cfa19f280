"""Issue 31: the twin rule where rounding is not smooth (a discrete decision flips).

The antithetic probes (the twin run again with +/- a rounding-sized step) mark the
elements that jump (:func:`unstable_mask`); :func:`judge` keeps them out of the stable
elements' noise and budget and judges them as a bounded population (:class:`Flips`).
Pure tensors here; the probes' runs and real cases are in tests/worlds/test_parity_flip_worlds.py.
"""

from __future__ import annotations

import pytest
import torch

from cpmatrix.parity.compare import (
    Probed,
    allowed_flips,
    compare_named,
    judge,
    pooled_noise,
    twin_verdict,
    unstable_mask,
)
from cpmatrix.parity.flips import (
    BUG_SIZE,
    PROBE_CAP_ULPS,
    Flips,
    Probes,
    flip_verdict,
    probes_of,
    resolution_line,
    second_noise,
    second_of,
)
from cpmatrix.parity.tolerance import tolerance_for

D = torch.float64
BF16 = tolerance_for("bf16")
RULE = BF16.twin
assert RULE is not None


def _case(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(twin, serial): values near 1, the serial side off by ~1e-3 (rounding)."""
    g = torch.Generator().manual_seed(seed)
    twin = torch.rand(n, generator=g, dtype=D) + 0.5
    noise = (torch.rand(n, generator=g, dtype=D) - 0.5) * 2e-3
    return twin, twin + noise


def _probes(twin: torch.Tensor, jumps: dict[int, float]) -> tuple[torch.Tensor, ...]:
    """Two antithetic pairs: smooth +/- 1e-3 everywhere, plus the given jumps on the +
    probe of the first pair (a decision that flips one way only)."""
    step = torch.full_like(twin, 1e-3)
    plus = twin + step
    for i, j in jumps.items():
        plus[i] += j
    return (plus, twin - step, twin - step, twin + step)


def test_unstable_mask_marks_one_sided_jumps_not_smooth_moves() -> None:
    twin, _ = _case(8)
    probes = _probes(twin, {3: 0.8})
    assert unstable_mask(twin, probes, 1e-6).nonzero().flatten().tolist() == [3]
    # a non-finite probe where the twin is finite: unstable too (an overflow is a jump)
    probes = (probes[0].clone(), *probes[1:])
    probes[0][5] = float("inf")
    assert unstable_mask(twin, probes, 1e-6).nonzero().flatten().tolist() == [3, 5]


def test_unstable_means_a_jump_beyond_the_threshold_or_a_nan_probe() -> None:
    twin = torch.tensor([0.0, 0.0, 1.0], dtype=D)
    plus = torch.tensor([0.5, 0.25, float("nan")], dtype=D)
    # a jump of exactly the threshold is not beyond it; a NaN probe where the twin is
    # finite is unstable (no comparison with NaN is true: it must not read as smooth)
    assert unstable_mask(twin, (plus, twin), 0.5).tolist() == [False, False, True]


def test_probes_not_in_pairs_are_refused_not_truncated() -> None:
    twin = torch.zeros(2, dtype=D)
    with pytest.raises(ValueError):
        unstable_mask(twin, (twin, twin, twin + 1.0), 0.1)


def test_complex_twin_values_take_complex128_probes_only() -> None:
    value = torch.tensor([1 + 1j, 2 - 1j], dtype=torch.complex128)
    probes = (value + 1e-3, value - 1e-3)
    got = probes_of(Probed(value, probes), value)
    assert got is not None and all(torch.equal(g, p) for g, p in zip(got, probes, strict=True))
    real = tuple(p.real.contiguous() for p in probes)
    assert probes_of(Probed(value, real), value) is None
    assert probes_of(Probed(value.real, real), value.real) is not None


def test_a_serial_flip_no_longer_switches_off_the_check_of_its_tensor() -> None:
    # issue 31, finding 2: one serial element moved by O(1) (its decision flipped) made
    # the budget F * max|s - t| swallow a 10% bug everywhere else in the tensor
    twin, serial = _case()
    serial[7] = twin[7] + 1.15
    buggy = twin * 0.9
    buggy[7] = serial[7]
    _, bad, *_ = twin_verdict(buggy, serial, twin, RULE)  # no probes: the old rule
    assert not bad.any()  # the bug hides
    probes = _probes(twin, {7: 1.15})
    _name, bad, _, serial_err, _, flips = judge(buggy, serial, twin, RULE, probes=probes)
    assert serial_err < 2e-3  # the flip is not noise
    assert int(bad.sum()) > len(twin) // 2  # the bug is seen
    assert flips is not None and not flips.ok


def test_a_cp_flip_where_the_probes_flip_passes_and_is_named() -> None:
    # issue 31, finding 1: the CP side takes the other branch on one element
    twin, serial = _case()
    cp = twin.clone()
    cp[7] = twin[7] + 0.6
    _, bad, *_ = twin_verdict(cp, serial, twin, RULE)  # without probes: fails
    assert bad.nonzero().flatten().tolist() == [7]
    _name, bad, twin_err, _, budget, flips = judge(
        cp, serial, twin, RULE, probes=_probes(twin, {7: 0.6})
    )
    assert not bad.any() and twin_err <= budget
    assert flips is not None and flips.ok
    # the + probe moved it too: about as many (1) plus the slack
    assert (flips.unstable, flips.cp, flips.serial, flips.allowed) == (1, 1, 0, 2)
    assert flips.where == ((7,),)
    assert "CP moved 1 [7], serial 0, allowed 2" in flips.line()


def test_more_cp_flips_than_the_serial_side_or_a_probe_made_fail() -> None:
    twin, serial = _case()
    probes = _probes(twin, {7: 0.6})  # one decision is near a tie
    cp = twin.clone()
    cp[7] += 0.6
    cp[9] += 0.6
    *_, flips = judge(cp, serial, twin, RULE, probes=probes)
    assert flips is not None and flips.ok and flips.cp == 2 and flips.allowed == 2
    cp[11] += 0.6  # a third one: too many
    *_, flips = judge(cp, serial, twin, RULE, probes=probes)
    assert flips is not None and not flips.ok and flips.cp == 3
    assert flips.line().endswith("FLIPS BEYOND THE SERIAL SIDE'S")
    _name, bad, *_ = twin_verdict(cp, serial, twin, RULE, probes=probes)
    assert bad.nonzero().flatten().tolist() == [7, 9, 11]


def test_a_flip_farther_than_any_probe_or_serial_moved_fails() -> None:
    twin, serial = _case()
    probes = _probes(twin, {7: 0.1})
    reach = RULE.factor * (0.1 + 1e-3)
    for moved, fails in ((0.9 * reach, False), (1.5 * reach + 0.1, True)):
        cp = twin.clone()
        cp[7] += moved
        *_, flips = judge(cp, serial, twin, RULE, probes=probes)
        assert flips is not None and flips.ok is not fails, moved


def test_allowed_flips_is_about_as_many_plus_a_slack() -> None:
    assert [allowed_flips(n) for n in (0, 1, 2, 3, 10)] == [1, 2, 4, 5, 16]


def test_a_tensor_the_probes_never_flip_is_judged_as_before() -> None:
    twin, serial = _case()
    cp = twin.clone()
    cp[3] += 0.5
    smooth = _probes(twin, {})
    plain = twin_verdict(cp, serial, twin, RULE)
    probed = judge(cp, serial, twin, RULE, probes=smooth)
    assert probed[1].tolist() == plain[1].tolist() and probed[4] == plain[4]
    assert probed[5] is None


def test_compare_named_takes_probed_twin_values_and_pools_without_flips() -> None:
    twin, serial = _case()
    serial[7] = twin[7] + 1.15  # a serial flip
    probed = Probed(twin, _probes(twin, {7: 1.15}))
    bias_twin = torch.tensor([2.0], dtype=D)
    pairs = {"w": (twin, serial, probed), "b": (bias_twin * 0.9, bias_twin, bias_twin)}
    diffs = {d.name: d for d in compare_named(pairs, BF16)}
    assert diffs["w"].ok and diffs["w"].flips is not None
    # the flip is no sample of the rounding: the one-element bias is not pooled with it
    assert pooled_noise([(torch.where(torch.arange(64) == 7, twin, serial), twin)]) < 2e-3
    assert not diffs["b"].ok, diffs["b"].line()


def test_a_probed_value_with_probes_of_another_shape_is_judged_unprobed() -> None:
    twin, serial = _case()
    bad_probes = Probed(twin, (twin[:3], twin[:3]))
    (diff,) = compare_named({"w": (twin, serial, bad_probes)}, BF16)
    assert diff.ok and diff.flips is None and diff.rule == "twin"


@pytest.mark.parametrize("odd", [(), ("x",)])
def test_probes_not_in_pairs_are_ignored(odd: tuple[str, ...]) -> None:
    twin, serial = _case()
    probes = tuple(twin for _ in odd)  # zero or one probe: no antithetic pair
    (diff,) = compare_named({"w": (twin, serial, Probed(twin, probes))}, BF16)
    assert diff.ok and diff.flips is None


def test_a_tiny_tensor_of_a_probed_check_adds_one_typical_draw_not_four() -> None:
    # issue 31, finding 3: the pooled noise times F let a 10% bug pass on a 1- or 3-element
    # bias grad. With probes (a step check) a tiny tensor gets F x its own noise + the floor
    # + ONE typical draw of its check's noise (the median over its larger tensors).
    twin = torch.tensor([2.0, -1.0, 0.5], dtype=D)
    serial = twin.clone()
    smooth = (twin + 1e-4, twin - 1e-4)
    pooled = 0.025  # bf16: 2.5% of the scale, typical
    budget = RULE.floor(2.0) + pooled * 2.0  # 4 ulp + one draw: 5.6% of the scale
    name, bad, _, _, got = twin_verdict(
        twin * 0.9, serial, twin, RULE, pooled=pooled, probes=smooth
    )
    assert name == "twin-pooled" and got == pytest.approx(budget)
    assert bad.tolist() == [True, False, False]  # the 10% bug on the largest: seen
    ok = twin + torch.tensor([0.9 * budget, 0.0, 0.0], dtype=D)
    assert not twin_verdict(ok, serial, twin, RULE, pooled=pooled, probes=smooth)[1].any()
    # without probes (a training check): F x the pooled noise, as before
    assert twin_verdict(twin * 0.9, serial, twin, RULE, pooled=pooled)[4] == pytest.approx(
        RULE.budget(serial_err=pooled * 2.0, scale=2.0)
    )


def test_the_probes_run_the_twin_again_and_keep_its_grads() -> None:
    from cpmatrix.parity._twin import make_twin, outputs_of, run_probes, upcast_inputs

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    twin = make_twin(net)
    x = torch.randn(6, 4)
    ins, leaves = upcast_inputs({"input": x}, ["input"])
    out = outputs_of(twin.module(**ins))
    grads = {"out": torch.randn(6, 2)}
    out["out"].backward(grads["out"].double())
    kept = {n: p.grad.clone() for n, p in twin.module.named_parameters()}
    twin.outputs = {"out": out["out"].detach()}
    twin.input_grads = {"input": leaves["input"].grad}
    twin.param_grads = {n: p.grad for n, p in twin.module.named_parameters()}
    run_probes(twin, ins, ["input"], grads, 2.0**-7)
    assert twin.probed and not twin.probe_why
    for values in (twin.outputs, twin.input_grads, twin.param_grads):
        for v in values.values():
            assert isinstance(v, Probed) and len(v.probes) == 4
            assert all(p.shape == v.value.shape for p in v.probes)
    for n, p in twin.module.named_parameters():  # the twin's own grads are untouched
        assert torch.equal(p.grad, kept[n]) and torch.equal(twin.param_grads[n].value, kept[n])
    # a smooth output (before any ReLU is only piecewise): the probes move it both ways
    first = twin.param_grads["2.bias"]
    assert not unstable_mask(first.value, first.probes, 1e-9).any()


def test_a_probe_that_cannot_run_leaves_the_values_unprobed() -> None:
    from cpmatrix.parity._twin import Twin, run_probes

    calls = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("no float64 kernel")
        return x * 2

    twin = Twin(module=fn)
    twin.outputs = {"out": torch.ones(2, dtype=D)}
    run_probes(twin, {"x": torch.ones(2, dtype=D)}, [], {}, 2.0**-7)
    assert not twin.probed and "RuntimeError: no float64 kernel" in twin.probe_why
    assert not isinstance(twin.outputs["out"], Probed)


class _Running(torch.nn.Module):
    """A forward that updates a running mean (BatchNorm-like state)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.register_buffer("running_mean", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        with torch.no_grad():
            self.running_mean.mul_(0.9).add_(0.1 * h.mean(0))
        return h - self.running_mean


def test_the_probes_start_from_the_twins_buffers_and_leave_them_as_its_run_did() -> None:
    # a stateful forward run four more times must neither drift the twin's buffers (the
    # buffer check's reference) nor make its smooth output look like a flip everywhere
    from cpmatrix.parity._twin import (
        make_twin,
        outputs_of,
        run_probes,
        set_buffers,
        upcast_inputs,
    )

    torch.manual_seed(0)
    twin = make_twin(_Running())
    assert torch.equal(twin.start["running_mean"], torch.zeros(3, dtype=D))
    ins, leaves = upcast_inputs({"x": torch.randn(8, 3)}, ["x"])
    out = outputs_of(twin.module(**ins))
    grads = {"out": torch.randn(8, 3)}
    out["out"].backward(grads["out"].double())
    after = twin.module.running_mean.clone()
    twin.outputs = {"out": out["out"].detach()}
    twin.input_grads = {"x": leaves["x"].grad}
    run_probes(twin, ins, ["x"], grads, 2.0**-7)
    assert twin.probed
    assert torch.equal(twin.module.running_mean, after)
    probed = twin.outputs["out"]
    assert isinstance(probed, Probed)
    assert not unstable_mask(probed.value, probed.probes, 2.0**-7 * 4).any()
    # a buffer the forward replaced by one of another shape is replaced back
    twin.module.running_mean = torch.zeros(5, dtype=D)
    set_buffers(twin.module, {"running_mean": after})
    assert torch.equal(twin.module.running_mean, after)


def _flip_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(twin, serial, unstable): four elements, the first three unstable, the serial side
    moved the first by 0.25 (exact in binary: the boundaries below are exact)."""
    twin = torch.ones(4, dtype=D)
    serial = twin + torch.tensor([0.25, 0.0, 0.0, 0.0], dtype=D)
    return twin, serial, torch.tensor([True, True, True, False])


def test_a_flip_exactly_at_its_reach_passes_and_a_move_at_the_budget_is_no_flip() -> None:
    twin, serial, unstable = _flip_case()
    cp_abs = torch.tensor([1.25, 0.0, 0.0, 0.0], dtype=D)  # reach: 4 x 0.25 + 0.25
    no = torch.zeros(4, dtype=torch.bool)
    flips, bad = flip_verdict(
        cp_abs, serial, twin, (twin, twin), unstable, ~unstable, no, 0.25, 4.0
    )
    assert flips is not None and flips.ok and not bad.any()
    # the serial side moved its element by exactly the budget: not off it, so no flip of
    # the serial side, and the CP side may flip one (the slack), not two
    assert (flips.unstable, flips.cp, flips.serial, flips.allowed) == (3, 1, 0, 1)
    flips, bad = flip_verdict(
        cp_abs + 1e-9, serial, twin, (twin, twin), unstable, ~unstable, no, 0.25, 4.0
    )
    assert flips is not None and not flips.ok and bad.tolist() == [True, False, False, False]


def test_a_probe_that_overflowed_bounds_no_flip() -> None:
    # a NaN or inf probe marks its element unstable, but moved it by no finite amount:
    # the reach comes from the finite moves only (4 x 0.01 + 0.05 = 0.09)
    twin, _, unstable = _flip_case()
    serial = twin + torch.tensor([0.01, 0.0, 0.0, 0.0], dtype=D)
    plus = twin.clone()
    plus[1], plus[2] = float("nan"), float("inf")
    no = torch.zeros(4, dtype=torch.bool)
    for moved, ok in ((0.08, True), (0.5, False)):
        cp_abs = torch.tensor([moved, 0.0, 0.0, 0.0], dtype=D)
        flips, bad = flip_verdict(
            cp_abs, serial, twin, (plus, twin), unstable, ~unstable, no, 0.05, 4.0
        )
        assert flips is not None and flips.ok is ok and bool(bad.any()) is not ok, moved
        assert (flips.cp, flips.serial, flips.allowed) == (1, 0, 2)  # inf moved one


def test_the_flips_line_names_the_first_indices_counts_the_rest_and_says_beyond() -> None:
    many = Flips(47, 7, 0, 19, ((9, 3), (9, 4)))
    assert many.line() == (
        "47 unstable (a rounding-sized probe flips them): CP moved 7 "
        "[(9, 3), (9, 4), ...], serial 0, allowed 19"
    )
    beyond = Flips(3, 2, 1, 2, ((4,), (7,)), ok=False)
    assert beyond.line() == (
        "3 unstable (a rounding-sized probe flips them): CP moved 2 "
        "[4, 7], serial 1, allowed 2, FLIPS BEYOND THE SERIAL SIDE'S"
    )


# --- the second serial sample (issue 31: tiny and cancelling tensors) -------------------


def test_a_second_sample_widens_a_tiny_tensors_budget_to_its_own_noise() -> None:
    # a 1-element sum cancelling to 0.05 from terms ~1: serial rounded once at the value's
    # scale (exact here), the CP side's partial sums at the terms' (1 bf16 ulp = 9%)
    twin = torch.tensor([0.0518], dtype=D)
    serial, cp = twin.clone(), twin + 0.0049
    _, bad, _, _, budget, _ = judge(cp, serial, twin, RULE)
    assert bad.all() and budget < 0.0049  # one sample: the correct CP side fails
    second = twin + 0.0049  # the same sum split as the CP side splits it: the same grid
    _, bad, _, serial_err, budget, _ = judge(cp, serial, twin, RULE, second=second)
    assert not bad.any()
    assert serial_err == 0.0  # the evidence keeps the tensor's own serial error
    assert budget == pytest.approx(RULE.budget(serial_err=0.0049, scale=0.0518))
    # a value where the second sample is exact keeps the tight budget: a 10% bug fails
    _, bad, *_ = judge(twin * 1.1, serial, twin, RULE, second=twin.clone())
    assert bad.all()


def test_a_second_sample_counts_only_where_one_sample_cannot_judge() -> None:
    # 16 elements or more, not cancelling: the tensor's own noise judges, as before
    twin, serial = _case(16)
    second = twin + 0.05
    cp = twin + 0.08  # beyond the floor (4 ulp at ~1.5: 0.047), within 4 x the sample's
    _, bad, _, _, budget, _ = judge(cp, serial, twin, RULE, second=second)
    assert bad.all(), budget
    # the same values cut to 15 elements: the sample counts
    _, bad, *_ = judge(cp[:15], serial[:15], twin[:15], RULE, second=second[:15])
    assert not bad.any()


def test_a_cancelling_tensors_norm_budget_takes_the_larger_samples_norm() -> None:
    twin = torch.full((32,), 1e-3, dtype=D)
    serial = twin + 1e-3  # rounding noise as large as the value: judged by norms
    second = twin + 3e-3
    cp = twin + 8e-3
    name, bad, *_ = judge(cp, serial, twin, RULE)
    assert name == "twin-norm" and bad.all()
    name, bad, _, serial_norm, _, _ = judge(cp, serial, twin, RULE, second=second)
    assert name == "twin-norm" and not bad.any()
    assert serial_norm == pytest.approx(3e-3 * 32**0.5)


def test_a_flipped_element_of_the_second_sample_is_no_sample_of_the_rounding() -> None:
    twin, serial = _case(8)
    probes = _probes(twin, {3: 0.8})
    second = serial.clone()
    second[3] += 0.8  # the split run took the other branch there
    cp = twin * 1.1
    _, bad, *_ = judge(cp, serial, twin, RULE, probes=probes, second=second)
    assert bad[[0, 1, 2, 4, 5, 6, 7]].all()


def test_second_of_takes_a_float64_sample_of_the_values_shape_only() -> None:
    value = torch.ones(3, dtype=D)
    expected = torch.ones(3, dtype=D)
    assert second_of(Probed(value, (), value + 1), expected).tolist() == [2.0, 2.0, 2.0]
    assert second_of(Probed(value, ()), expected) is None
    assert second_of(value, expected) is None
    assert second_of(Probed(value, (), torch.ones(2, dtype=D)), expected) is None
    assert second_of(Probed(value, (), torch.ones(3)), expected) is None  # float32: no twin
    assert second_noise(None, value, value.bool()) == (0.0, 0.0)
    nan = torch.tensor([float("nan"), 1.5, 1.0], dtype=D)
    assert second_noise(nan, value, torch.ones(3, dtype=torch.bool)) == (0.5, 0.5)


def test_compare_named_judges_with_the_second_sample_and_names_it() -> None:
    twin = torch.tensor([0.0518], dtype=D)
    pairs = {"b": ((twin + 0.0049).bfloat16(), twin.bfloat16(),
                   Probed(twin, (), twin + 0.0049))}
    [d] = compare_named(pairs, BF16)
    assert d.ok, d.line()
    assert d.second_err == pytest.approx(0.0049, rel=0.05)
    assert "a second serial sample's 0.0049" in d.line()
    assert d.scale == pytest.approx(0.0518)
    assert "BELOW RESOLUTION" in resolution_line(d.name, d.budget, d.scale)
    [d] = compare_named({"b": (twin.bfloat16(), twin.bfloat16(), twin)}, BF16)
    assert d.second_err is None and "second" not in d.line()


def test_resolution_line_names_a_tensor_a_10pct_bug_cannot_fail_on() -> None:
    assert BUG_SIZE == 0.1
    assert "BELOW" not in resolution_line("b", 0.1, 1.0)  # exactly 10%: a 10% bug is seen
    assert "BELOW RESOLUTION" in resolution_line("b", 0.1001, 1.0)
    zero = resolution_line("b", 0.5, 0.0)
    assert zero == "b: a change under 0% of its largest value (0) passes"
    assert "under 1.2e-05% of" in resolution_line("b", 1.23e-7, 1.0)


def test_resolution_line_reads_the_budget_exactly_and_keeps_its_head_below_resolution() -> None:
    assert "under 9.9% of" in resolution_line("b", 0.0993, 1.0)  # 10.03% would read "10%"
    below = resolution_line("b", 0.25, 1.0)
    assert below.startswith("b: a change under 25% of its largest value (1) passes: BELOW")
    assert below.endswith("(a 10% bug on it is within its rounding noise)")
    empty = torch.zeros(0, dtype=D)
    assert second_noise(empty, empty, empty.bool()) == (0.0, 0.0)



FP32 = tolerance_for("fp32")
FP32_RULE = FP32.twin
assert FP32_RULE is not None
ULP = 2**-23 * 0.026  # one fp32 ulp of the tensors' largest value below


def _one_cancelling_element() -> tuple[torch.Tensor, ...]:
    """(twin, serial, cp, move): 16 elements up to 0.026, element 5 a sum that cancels to
    4.2e-5 from terms at the tensor's scale (the suite's fp32 train_step, rep 13: a
    pair-attention bias grad). The serial side's one draw there is 2.7 ulps of the scale,
    the correct CP side's 20; the probes move it 19.7 (measured)."""
    g = torch.Generator().manual_seed(13)
    twin = (torch.rand(16, generator=g, dtype=D) - 0.5) * 0.04
    twin[0], twin[5] = 0.026, 4.2e-5
    serial, cp, move = twin.clone(), twin.clone(), torch.full_like(twin, 0.5 * ULP)
    serial[5] += 2.7 * ULP
    cp[5] += 20 * ULP
    move[5] = 19.7 * ULP
    return twin, serial, cp, move


def _pairs(twin: torch.Tensor, inputs: torch.Tensor, outputs: torch.Tensor) -> Probes:
    """The two antithetic pairs of :func:`run_probes`: the inputs and outputs stepped,
    then the module outputs alone (the pair that is a draw of the rounding)."""
    return (twin + inputs, twin - inputs, twin + outputs, twin - outputs)


def test_in_fp32_the_probes_move_counts_as_a_draw_of_the_serial_noise() -> None:
    twin, serial, cp, move = _one_cancelling_element()
    _, bad, *_ = judge(cp, serial, twin, FP32_RULE)
    assert bad.tolist() == [i == 5 for i in range(16)]  # one lucky serial draw: fails
    probes = _pairs(twin, move, move)
    _, bad, _, serial_err, budget, _ = judge(cp, serial, twin, FP32_RULE, probes=probes)
    assert not bad.any()
    assert serial_err == pytest.approx(2.7 * ULP)  # the evidence: its own draw
    assert budget == pytest.approx(FP32_RULE.budget(serial_err=19.7 * ULP, scale=0.026))
    # a 10% bug on the largest element is still far outside
    buggy = cp.clone()
    buggy[0] *= 1.1
    _, bad, *_ = judge(buggy, serial, twin, FP32_RULE, probes=probes)
    assert bad.tolist() == [i == 0 for i in range(16)]


def test_in_bf16_the_probes_move_is_no_draw_of_the_serial_noise() -> None:
    # 2 to 6 times the rounding there: it would put a 10% bug on a tiny tensor in budget
    twin, serial, cp, move = _one_cancelling_element()
    scale = 2**-7 / 2**-23  # the same numbers in bf16 ulps
    probes = _pairs(twin, move * scale, move * scale)
    serial = twin + (serial - twin) * scale
    cp = twin + (cp - twin) * scale
    _, bad, *_ = judge(cp, serial, twin, RULE, probes=probes)
    assert bad.tolist() == [i == 5 for i in range(16)]


def test_the_move_of_the_output_step_alone_counts_not_the_input_step() -> None:
    # the inputs are the same on both sides: their step is no rounding (an exact
    # difference of large coordinates moves with it by far more than any op rounds)
    twin, serial, cp, move = _one_cancelling_element()
    big = torch.full_like(twin, 25 * ULP)
    _, bad, _, _, budget, _ = judge(cp, serial, twin, FP32_RULE, probes=_pairs(twin, big, move))
    assert not bad.any()
    assert budget == pytest.approx(FP32_RULE.budget(serial_err=19.7 * ULP, scale=0.026))
    _, bad, *_ = judge(cp, serial, twin, FP32_RULE, probes=_pairs(twin, move, big * 0 + ULP))
    assert bad.tolist() == [i == 5 for i in range(16)]  # the output step small: no cover


def test_a_decision_on_its_threshold_moves_both_ways_and_is_capped() -> None:
    # sign(0) at a tie: the two steps jump it by +J and -J, which looks smooth; uncapped,
    # a move of half the value would let a bug of any size pass (the review: 82%-200%)
    twin, serial, cp, move = _one_cancelling_element()
    move[7] = 0.013
    probes = _pairs(twin, move, move)
    _, _, _, _, budget, flips = judge(cp, serial, twin, FP32_RULE, probes=probes)
    assert flips is None or flips.unstable == 0  # not caught as a flip
    assert budget == pytest.approx(FP32_RULE.budget(serial_err=PROBE_CAP_ULPS * ULP,
                                                    scale=0.026))
    buggy = cp.clone()
    buggy[0] *= 1.001  # a 0.1% bug on the largest element still fails
    _, bad, *_ = judge(buggy, serial, twin, FP32_RULE, probes=probes)
    assert bad[0] and bad.sum() == 1


def test_the_probes_move_counts_over_stable_elements_and_never_in_a_norm() -> None:
    twin, serial, cp, move = _one_cancelling_element()
    probes = _pairs(twin, move, move)
    flipped = (*probes[:2], probes[2].clone(), probes[3])
    flipped[2][9] += 0.01  # a one-sided jump in the output step: a flip, not a move
    _, _, _, _, budget, flips = judge(cp, serial, twin, FP32_RULE, probes=flipped)
    assert flips is not None and flips.unstable == 1
    assert budget == pytest.approx(FP32_RULE.budget(serial_err=19.7 * ULP, scale=0.026))
    # a tensor that is rounding noise throughout is judged by its norms, the move not
    # among them (what it would count is not bounded by the value's scale there)
    twin = torch.full((32,), 1e-3, dtype=D)
    serial, cp = twin + 1e-3, twin + 8e-3
    move = torch.full_like(twin, 3e-3)
    name, bad, _, serial_norm, _, _ = judge(cp, serial, twin, FP32_RULE,
                                            probes=_pairs(twin, move, move))
    assert name == "twin-norm" and bad.all()
    assert serial_norm == pytest.approx(1e-3 * 32**0.5)
    [d] = compare_named({"w": (cp.float(), serial.float(), Probed(twin, _pairs(twin, move, move)))},
                        FP32)
    assert d.probe_err is None


def test_compare_named_names_the_probes_move_where_it_counted() -> None:
    twin, serial, cp, move = _one_cancelling_element()
    probed = Probed(twin, _pairs(twin, move, move))
    [d] = compare_named({"w": (cp.float(), serial.float(), probed)}, FP32)
    assert d.ok, d.line()
    assert d.probe_err == pytest.approx(19.7 * ULP, rel=1e-6)
    assert d.line().endswith("(serial's own 8.37e-09, the probes' move 6.11e-08)")
    # a flip in the output step is named by the flips, not as the move
    flipped = (*probed.probes[:2], probed.probes[2].clone(), probed.probes[3])
    flipped[2][9] += 0.01
    [d] = compare_named({"w": (cp.float(), serial.float(), Probed(twin, flipped))}, FP32)
    assert d.probe_err == pytest.approx(19.7 * ULP, rel=1e-6)
    # where the serial side's own draw is the larger, the move did not count: not named
    quiet = Probed(twin, _pairs(twin, move * 0.1, move * 0.1))
    [d] = compare_named({"w": (cp.float(), serial.float(), quiet)}, FP32)
    assert d.probe_err is None and "probes' move" not in d.line()
    [d] = compare_named({"w": (cp.bfloat16(), serial.bfloat16(), probed)}, BF16)
    assert d.probe_err is None and "probes' move" not in d.line()
