"""compare_named: assert_close's criterion, over a whole named set, with every mismatch."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch.distributed.tensor import Shard

from cpmatrix.parity import Diff, ParityError, compare_named, format_diffs, tolerance_for
from cpmatrix.parity.compare import (
    POOL_BELOW,
    pooled_noise,
    ratio_hint,
    twin_verdict,
    uniform_ratio,
)
from cpmatrix.parity.trees import flatten
from fake_mesh import FakeDTensor

FP64 = tolerance_for("fp64")


def _assert_close_ok(a: torch.Tensor, e: torch.Tensor) -> bool:
    try:
        torch.testing.assert_close(a, e, rtol=FP64.rtol, atol=FP64.atol)
    except AssertionError:
        return False
    return True


def test_same_verdict_as_assert_close_at_the_boundary() -> None:
    g = torch.Generator().manual_seed(0)
    verdicts = set()
    for scale in (1e-9, 5e-8, 1e-7, 2e-7, 1e-6):
        e = torch.randn(64, generator=g, dtype=torch.float64)
        a = e + scale * torch.randn(64, generator=g, dtype=torch.float64)
        (diff,) = compare_named({"t": (a, e)}, FP64)
        assert diff.ok == _assert_close_ok(a, e), scale
        verdicts.add(diff.ok)
    assert verdicts == {True, False}, "the scales must straddle the boundary"


def test_reports_max_abs_and_max_rel() -> None:
    e = torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64)
    a = torch.tensor([1.5, 2.0, 0.25], dtype=torch.float64)
    (d,) = compare_named({"y": (a, e)}, FP64)
    assert (d.ok, d.max_abs, d.max_rel, d.bad, d.numel) == (False, 0.5, 0.5, 2, 3)


def test_every_mismatching_tensor_is_listed() -> None:
    ok = torch.ones(3, dtype=torch.float64)
    diffs = compare_named({
        "out": (ok, ok),
        "grad x": (ok * 2, ok),
        "grad w": (ok + 1e-3, ok),
    }, FP64)
    text = format_diffs("param_grad", diffs, FP64)
    assert text.startswith("param_grad: 2 of 3 tensors differ from serial")
    assert "grad x: max abs 1" in text and "grad w: max abs 0.001" in text
    assert "out:" not in text


@pytest.mark.parametrize(
    ("actual", "expected", "ok", "note"),
    [
        (torch.tensor([float("nan")]), torch.tensor([float("nan")]), False, ""),
        (torch.tensor([float("nan")]), torch.tensor([1.0]), False, ""),
        (torch.tensor([float("inf")]), torch.tensor([float("inf")]), True, ""),
        (torch.tensor([float("inf")]), torch.tensor([-float("inf")]), False, ""),
        (torch.tensor([1, 2]), torch.tensor([1, 3]), False, ""),
        (torch.zeros(2, 3), torch.zeros(3, 2), False, "shape (2, 3) != serial (3, 2)"),
        (torch.zeros(2, dtype=torch.float32), torch.zeros(2, dtype=torch.float64), False,
         "dtype torch.float32 != serial torch.float64"),
        (None, torch.zeros(2), False, "missing on the CP side"),
    ],
)
def test_edge_cases(actual: object, expected: object, ok: bool, note: str) -> None:
    (d,) = compare_named({"t": (actual, expected)}, FP64)
    assert d.ok is ok
    assert d.note == note


def test_flatten_names_nested_outputs() -> None:
    out = {"a": torch.zeros(1), "b": (torch.zeros(1), [torch.zeros(1)])}
    assert [n for n, _ in flatten(out)] == ["out.a", "out.b.0", "out.b.1.0"]
    assert [n for n, _ in flatten(torch.zeros(1))] == ["out"]


INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize(
    ("actual", "expected", "ok", "bad"),
    [
        # a serial inf never fits inside `atol + rtol * |inf|`, nor does a CP one
        ([1.0, 5.0], [INF, 5.0], False, 1),
        ([INF, 5.0], [1.0, 5.0], False, 1),
        ([-INF, INF], [-INF, INF], True, 0),  # equal infs of the same sign are equal
        ([NAN, INF], [NAN, -INF], False, 2),  # NaN is never equal, not even to NaN
        ([1.0, 2.0], [1.0 + 5e-8, 2.0 - 2e-7], True, 0),  # within atol + rtol * |e|
    ],
)
def test_non_finite_values(actual: list[float], expected: list[float], ok: bool,
                           bad: int) -> None:
    a, e = torch.tensor(actual, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64)
    (d,) = compare_named({"t": (a, e)}, FP64)
    assert (d.ok, d.bad, d.numel) == (ok, bad, 2)
    if not ok:
        assert d.max_abs == INF  # inf or NaN evidence is inf, not the largest float


@pytest.mark.parametrize(
    ("actual", "expected", "want"),
    [
        (3, 3, Diff("leaf", True, 0.0, 0.0, 0, 1)),
        (3, 4, Diff("leaf", False, INF, 0.0, 1, 1, "3 != 4")),
        (0.5, 0.5, Diff("leaf", True, 0.0, 0.0, 0, 1)),
        # leaves are exact
        (0.5, 0.5 + 1e-12, Diff("leaf", False, INF, 0.0, 1, 1, "0.5 != 0.500000000001")),
        (NAN, NAN, Diff("leaf", False, INF, 0.0, 1, 1, "nan != nan")),
        ("mean", "mean", Diff("leaf", True, 0.0, 0.0, 0, 1)),
        ("mean", "sum", Diff("leaf", False, INF, 0.0, 1, 1, "'mean' != 'sum'")),
        # e.g. an optional output absent on both sides
        (None, None, Diff("leaf", True, 0.0, 0.0, 0, 1)),
        (None, 3, Diff("leaf", False, INF, INF, 0, 0, "missing on the CP side")),
        (3, None, Diff("leaf", False, INF, INF, 0, 0, "missing on the serial side")),
        # a tensor against a non-tensor is never compared elementwise
        (torch.ones(3), 1.0, Diff("leaf", False, INF, INF, 1, 1, "Tensor != serial float")),
        (1, torch.ones(()), Diff("leaf", False, INF, INF, 1, 1, "int != serial Tensor")),
    ],
)
def test_non_tensor_leaves_are_compared_by_equality_and_reported(
    actual: object, expected: object, want: Diff,
) -> None:
    (d,) = compare_named({"leaf": (actual, expected)}, FP64)
    assert d == want


def test_a_leaf_without_a_truth_value_is_a_mismatch() -> None:
    class Ambiguous:
        def __eq__(self, other: object) -> bool:
            raise ValueError("no single truth value")

    (d,) = compare_named({"leaf": (Ambiguous(), Ambiguous())}, FP64)
    assert (d.ok, d.bad) == (False, 1) and " != " in d.note


def test_integer_and_bool_tensors_are_compared_exactly() -> None:
    big = torch.tensor([2**53 + 1, 7])  # no float64 holds 2**53 + 1
    (d,) = compare_named({"i": (big, torch.tensor([2**53, 7]))}, FP64)
    assert (d.ok, d.bad, d.max_abs) == (False, 1, 1.0)
    flipped = torch.tensor([True, False, True])
    (d,) = compare_named({"b": (~flipped, flipped)}, FP64)
    assert (d.ok, d.bad, d.numel, d.max_abs) == (False, 3, 3, 1.0)
    (d,) = compare_named({"i": (torch.tensor([1, 2]), torch.tensor([1, 2]))}, FP64)
    assert d.ok and d.max_abs == 0.0


def test_complex_tensors_compare_the_modulus_of_the_difference() -> None:
    e = torch.tensor([1 + 1j, 2 - 1j], dtype=torch.complex128)
    (d,) = compare_named({"z": (e + 1e-3j, e)}, FP64)  # only the imaginary part moved
    assert (d.ok, d.bad) == (False, 2)
    assert d.max_abs == pytest.approx(1e-3)
    (d,) = compare_named({"z": (e + 1e-9j, e)}, FP64)
    assert d.ok and d.max_abs == pytest.approx(1e-9)


def test_the_allowance_is_inclusive_as_in_assert_close() -> None:
    # |a - e| == atol + rtol * |e| exactly (e = 0: the allowance is atol)
    (d,) = compare_named({"t": (torch.tensor([1e-7], dtype=torch.float64),
                                torch.tensor([0.0], dtype=torch.float64))}, FP64)
    assert d.ok and d.max_abs == 1e-7


def test_low_precision_and_mixed_dtypes_are_measured_in_float64_or_complex128() -> None:
    # float16 would overflow: 60000 - (-60000) is inf in float16, 120000 in float64
    half = torch.tensor([60000.0], dtype=torch.float16)
    (d,) = compare_named({"t": (half, -half)}, FP64)
    assert (d.ok, d.max_abs) == (False, 120000.0)
    # a float against an int: a dtype mismatch, measured as floats (0.5, not 0)
    (d,) = compare_named({"t": (torch.tensor([0.5]), torch.tensor([0]))}, FP64)
    assert (d.ok, d.max_abs, d.note) == (False, 0.5, "dtype torch.float32 != serial torch.int64")
    # complex against real: the imaginary part still counts
    (d,) = compare_named({"t": (torch.tensor([1 + 2j]), torch.tensor([1.0]))}, FP64)
    assert (d.ok, d.max_abs) == (False, 2.0)


def test_empty_tensors_need_the_same_shape_and_dtype() -> None:
    empty = torch.zeros(0, 3)
    (d,) = compare_named({"t": (torch.zeros(0, 3), empty)}, FP64)
    assert d == Diff("t", True, 0.0, 0.0, 0, 0)
    (d,) = compare_named({"t": (torch.zeros(3, 0), empty)}, FP64)
    assert d == Diff("t", False, INF, INF, 0, 0, "shape (3, 0) != serial (0, 3)")
    (d,) = compare_named({"t": (torch.zeros(0, 3, dtype=torch.float64), empty)}, FP64)
    assert d == Diff("t", False, 0.0, 0.0, 0, 0, "dtype torch.float64 != serial torch.float32")


def test_relative_difference_ignores_zero_expected_values() -> None:
    (d,) = compare_named({"t": (torch.tensor([0.5, 4.0]), torch.tensor([0.0, 2.0]))}, FP64)
    assert (d.max_abs, d.max_rel) == (2.0, 1.0)
    (d,) = compare_named({"t": (torch.tensor([0.5]), torch.tensor([0.0]))}, FP64)
    assert (d.max_abs, d.max_rel) == (0.5, 0.0)


def test_dtensors_are_compared_through_their_full_value() -> None:
    full = torch.tensor([1.0, 2.0, 3.0, 4.0])
    cp = FakeDTensor(torch.tensor([1.0, 2.0]), (Shard(0),), full=full)
    (d,) = compare_named({"y": (cp, full.clone())}, FP64)  # the local shard alone: shape 2
    assert d.ok and d.numel == 4


def test_a_diff_line_carries_its_note() -> None:
    (d,) = compare_named({"t": (torch.zeros(2), torch.zeros(3))}, FP64)
    assert d == Diff("t", False, INF, INF, 3, 3, "shape (2,) != serial (3,)")
    assert d.line() == "t: max abs inf, max rel inf, 3/3 outside (shape (2,) != serial (3,))"
    (d,) = compare_named({"u": (torch.ones(2), torch.zeros(2))}, FP64)
    assert d.line() == "u: max abs 1, max rel 0, 2/2 outside"


def test_format_diffs_lists_only_the_mismatches_one_per_line() -> None:
    diffs = compare_named({"a": (torch.ones(1), torch.ones(1)), "b": (torch.ones(1), 2.0),
                           "c": (torch.zeros(1), torch.ones(1))}, FP64)
    assert format_diffs("output", diffs, FP64) == (
        "output: 2 of 3 tensors differ from serial (rtol=1e-07, atol=1e-07 (table "
        "fp64/off/reference))\n"
        "  b: max abs inf, max rel inf, 1/1 outside (Tensor != serial float)\n"
        "  c: max abs 1, max rel 1, 1/1 outside")


def test_flatten_names_dataclass_fields() -> None:
    @dataclasses.dataclass
    class Out:
        logits: torch.Tensor
        aux: tuple[int, ...]

    out = {"m": Out(torch.zeros(1), (1, 2))}
    assert [n for n, _ in flatten(out)] == ["out.m.logits", "out.m.aux.0", "out.m.aux.1"]
    assert [n for n, _ in flatten(Out, "x")] == ["x"]  # the class itself is a leaf


# --------------------------------------------------------------------------------------
# the fp64 twin rule (issue 22)

BF16 = tolerance_for("bf16")
FP32 = tolerance_for("fp32")
D = torch.float64


def _t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=D)


def test_twin_verdict_allows_factor_times_the_serial_error_plus_the_floor() -> None:
    rule = BF16.twin
    assert rule is not None
    twin = _t(1.0, -2.0, 0.5)
    serial = twin + _t(0.0, 0.01, -0.002)          # serial's worst error: 0.01
    worst = float((serial - twin).abs().max())
    floor = 4 * 2.0**-7 * 2.0                      # 4 ulp at max|twin| = 2
    budget = 4 * worst + floor
    cp = twin + _t(budget / 2, -budget / 2, 0.0)
    name, bad, twin_err, serial_err, got = twin_verdict(cp, serial, twin, rule)
    assert (name, bad.tolist(), serial_err, got) == (
        "twin", [False, False, False], worst, budget)
    assert twin_err == pytest.approx(budget / 2)
    assert worst == pytest.approx(0.01)
    over = twin + _t(0.0, 0.0, budget * 1.001)
    assert twin_verdict(over, serial, twin, rule)[1].tolist() == [False, False, True]


def test_twin_verdict_equal_to_serial_always_passes_and_nan_never_does() -> None:
    rule = FP32.twin
    assert rule is not None
    twin = _t(1.0, 2.0, 3.0)
    serial = _t(1.0, float("inf"), 3.5)
    cp = _t(float("nan"), float("inf"), 3.5)       # inf equals serial's inf: fine
    _, bad, twin_err, serial_err, _ = twin_verdict(cp, serial, twin, rule)
    assert bad.tolist() == [True, False, False]
    assert serial_err == 0.5  # the non-finite serial element does not count
    assert twin_err == INF


def test_twin_verdict_falls_back_to_norms_where_the_serial_side_is_noise() -> None:
    rule = FP32.twin
    assert rule is not None
    twin = _t(1e-9, -1e-9, 2e-9, 0.0)              # a grad that cancels to nothing
    serial = _t(3e-9, 1e-9, -2e-9, 1e-9)           # worst error >= half the scale: noise
    ok_cp = _t(-2e-9, 2e-9, 3e-9, -1e-9)
    name, bad, cp_norm, serial_norm, budget = twin_verdict(ok_cp, serial, twin, rule)
    assert name == "twin-norm" and not bad.any()
    assert serial_norm == pytest.approx(float(torch.linalg.vector_norm(serial - twin)))
    assert cp_norm == pytest.approx(float(torch.linalg.vector_norm(ok_cp - twin)))
    assert budget == pytest.approx(4 * serial_norm + 4 * 2.0**-23 * 2e-9 * 2)
    far = _t(1e-6, 0.0, 0.0, 0.0)
    name, bad, *_ = twin_verdict(far, serial, twin, rule)
    assert name == "twin-norm" and bad.all()
    same = serial.clone()                          # equal to serial: never bad
    assert not twin_verdict(same, serial, twin, rule)[1].any()


def test_twin_verdict_of_an_empty_tensor_passes() -> None:
    rule = FP32.twin
    assert rule is not None
    empty = torch.zeros(0, dtype=D)
    name, bad, twin_err, serial_err, budget = twin_verdict(empty, empty, empty, rule)
    assert (name, bad.numel(), twin_err, serial_err, budget) == ("twin", 0, 0.0, 0.0, 0.0)


def test_a_triple_is_judged_by_the_twin_and_a_pair_by_the_table() -> None:
    twin = _t(1e-4, 2e-4, 3e-4)
    serial = twin.to(torch.bfloat16)
    wrong = (twin * 2).to(torch.bfloat16)         # 100% off, far below bf16's fixed atol
    table, judged = compare_named({"p": (wrong, serial), "t": (wrong, serial, twin)}, BF16)
    assert table.ok and table.rule == "table"      # the fixed row passes it
    assert (table.twin_err, table.serial_err, table.budget, table.ratio) == (0.0, 0.0, 0.0, None)
    assert not judged.ok and judged.rule == "twin" and judged.bad == 3
    assert judged.serial_err == pytest.approx(float((serial.double() - twin).abs().max()))
    assert judged.ratio == pytest.approx(2.0, rel=0.01)


def _noisy(n: int, rel: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(serial, twin) of ``n`` elements, the serial side off by ``rel`` of the scale."""
    g = torch.Generator().manual_seed(seed)
    twin = torch.rand(n, generator=g, dtype=D) + 0.5            # max |twin| near 1.5
    sign = torch.where(torch.rand(n, generator=g, dtype=D) < 0.5, -1.0, 1.0)
    return twin + sign * rel * float(twin.abs().max()), twin


def test_a_few_element_tensor_takes_the_checks_pooled_noise() -> None:
    # The measured flake (bf16 autocast): a one-element weight delta whose serial side
    # happened to round to nearly the twin (1.8e-5, 0.2% of its value) while the rounding
    # of its check's larger tensors ran at 2-8% of their scale.
    serial_w, twin_w = _noisy(64, 0.03)
    twin_b = _t(0.0096)
    serial_b = twin_b + 1.8e-5
    cp_b = twin_b + 8.15e-4
    alone = compare_named({"b": (cp_b, serial_b, twin_b)}, BF16)[0]
    assert not alone.ok and alone.rule == "twin"  # one sample of the rounding judged it
    w, b = compare_named({"w": (serial_w, serial_w, twin_w), "b": (cp_b, serial_b, twin_b)},
                         BF16)
    assert w.ok and w.rule == "twin"
    assert b.ok and b.rule == "twin-pooled"
    pooled = pooled_noise([(serial_w, twin_w)])
    assert pooled == pytest.approx(0.03, rel=1e-6)
    assert b.budget == pytest.approx(BF16.twin.budget(serial_err=pooled * 0.0096, scale=0.0096))
    assert b.serial_err == pytest.approx(1.8e-5)  # its own, as measured
    assert "noise pooled over the check" in b.line() and "noise pooled" not in w.line()
    # A real bug on the small tensor (half its value) is still far outside.
    (_, half) = compare_named({"w": (serial_w, serial_w, twin_w),
                               "b": (twin_b * 0.5, serial_b, twin_b)}, BF16)
    assert not half.ok and half.rule == "twin-pooled"


def test_pooling_reaches_only_tensors_below_the_size_and_never_loosens_their_own() -> None:
    serial_w, twin_w = _noisy(64, 1e-2)
    for n, pooled_rule in ((POOL_BELOW - 1, "twin-pooled"), (POOL_BELOW, "twin")):
        serial, twin = _noisy(n, 1e-6, seed=1)
        scale = float(twin.abs().max())
        cp = twin + 0.05 * scale  # inside the pooled budget (7.1%), outside its own (3.1%)
        _, d = compare_named({"w": (serial_w, serial_w, twin_w), "s": (cp, serial, twin)},
                             BF16)
        assert (d.ok, d.rule) == (pooled_rule == "twin-pooled", pooled_rule), n
    # A small tensor noisier than the pool keeps its own (larger) estimate.
    serial, twin = _noisy(4, 5e-2, seed=2)
    _, d = compare_named({"w": (serial_w, serial_w, twin_w), "s": (serial, serial, twin)}, BF16)
    assert d.rule == "twin" and d.budget == pytest.approx(
        BF16.twin.budget(serial_err=d.serial_err, scale=float(twin.abs().max())))


def test_the_pool_skips_small_tensors_rounding_noise_and_values_without_a_twin() -> None:
    # Its estimators: tensors of at least POOL_BELOW elements, judged elementwise.
    big, big_twin = _noisy(POOL_BELOW, 2e-3)
    small, small_twin = _noisy(POOL_BELOW - 1, 0.3)
    cancel_twin = torch.full((32,), 1e-9, dtype=D)         # a grad that cancels: noise
    cancel = cancel_twin + 1e-6
    assert pooled_noise([(big, big_twin)]) == pytest.approx(2e-3)
    assert pooled_noise([(small, small_twin), (cancel, cancel_twin)]) == 0.0
    assert pooled_noise([(big, big_twin), (small, small_twin),
                         (cancel, cancel_twin)]) == pytest.approx(2e-3)
    assert pooled_noise([(torch.zeros(32, dtype=D), torch.zeros(32, dtype=D))]) == 0.0
    # Through compare_named: a pair (no twin) and integers never estimate it, and a
    # tolerance without a twin rule pools nothing.
    one = _t(0.5)
    cp = one + 0.03  # outside its own budget (floor 0.0156)
    pairs = {"pair": (big * 10, big * 10), "ints": (torch.arange(64), torch.arange(64)),
             "s": (cp, one + 1e-9, one)}
    assert not compare_named(pairs, BF16)[2].ok
    assert compare_named({"w": (big, big, big_twin), "s": (one + 1e-3, one + 1e-9, one)},
                         BF16)[1].rule == "twin-pooled"
    table = compare_named({"w": (big, big, big_twin), "s": (cp, one, one)}, FP64)
    assert [d.rule for d in table] == ["table", "table"]


@pytest.mark.parametrize("twin", [
    None, 3.0, torch.zeros(2, dtype=D),                  # no twin, not a tensor, wrong shape
    torch.zeros(3, dtype=torch.float32),                  # not float64: not a twin
])
def test_a_twin_value_that_cannot_judge_leaves_the_table_to_it(twin: Any) -> None:
    (d,) = compare_named({"t": (torch.ones(3), torch.ones(3), twin)}, FP32)
    assert d.rule == "table" and d.ok


def test_a_complex_twin_judges_complex_values() -> None:
    twin = torch.tensor([1 + 1j, 2 - 1j], dtype=torch.complex128)
    serial = twin.to(torch.complex64)
    (d,) = compare_named({"c": (serial * 1j, serial, twin)}, FP32)  # rotated by 90 degrees
    assert d.rule == "twin" and not d.ok and d.ratio is None


def test_the_fixed_rule_is_used_without_a_twin_rule_even_with_a_twin_value() -> None:
    twin = _t(1.0, 2.0)
    (d,) = compare_named({"t": (twin + 1e-3, twin, twin)}, FP64)
    assert d.rule == "table" and not d.ok


def test_a_twin_diff_line_says_the_budget_and_the_serial_error() -> None:
    twin = _t(1.0, 2.0)
    (d,) = compare_named({"y": (twin + 0.5, twin + 1e-3, twin)}, BF16)
    assert d.line() == (
        f"y: max abs {d.max_abs:.3g}, max rel {d.max_rel:.3g}, 2/2 outside; |cp - twin| 0.5 "
        f"vs budget {d.budget:.3g} (serial's own 0.001)")
    noise = compare_named({"z": (_t(10.0, 0.0), _t(1.0, 1.0), _t(0.0, 0.0))}, FP32)[0]
    assert noise.rule == "twin-norm"
    assert noise.line() == (f"z: max abs 9, max rel 9, 2/2 outside; ||cp - twin|| 10 vs budget "
                            f"{noise.budget:.3g} (serial's own {noise.serial_err:.3g})")


def test_the_pairs_must_be_pairs_or_triples() -> None:
    with pytest.raises(ParityError) as info:
        compare_named({"t": (torch.ones(1),) * 4}, FP32)
    assert info.value.check == "setup" and "a pair (cp, serial) or a triple" in str(info.value)


@pytest.mark.parametrize(("cp", "serial", "ratio"), [
    (_t(0.5, -1.0, 1.5, 1e-9), _t(1.0, -2.0, 3.0, 5e-10), 0.5),  # small elements ignored
    (_t(2.0, 4.0), _t(1.0, 2.0), 2.0),
    (_t(-1.0, -2.0), _t(1.0, 2.0), -1.0),
    (_t(1.0, 2.5), _t(1.0, 2.0), None),        # not uniform
    (_t(1.01, 2.0), _t(1.0, 2.0), None),       # 1% apart: not uniform
    (_t(3.0), _t(1.0), None),                  # one element: no evidence of uniformity
    (_t(0.0, 0.0), _t(1.0, 2.0), None),        # CP all zero: ratio 0 says nothing
    (_t(1.0, 2.0), _t(0.0, 0.0), None),        # serial zero: no ratio
    (_t(2.0, float("nan"), 4.0), _t(1.0, 1.0, 2.0), 2.0),  # non-finite left out
])
def test_uniform_ratio(cp: torch.Tensor, serial: torch.Tensor, ratio: float | None) -> None:
    assert uniform_ratio(cp, serial) == ratio


def test_uniform_ratio_within_one_percent_and_of_complex_values() -> None:
    assert uniform_ratio(_t(0.5, 1.0101), _t(1.0, 2.0)) is None   # 1.01% apart
    assert uniform_ratio(_t(0.5, 1.0099), _t(1.0, 2.0)) == 0.5    # 0.99%: the median
    z = torch.tensor([1 + 1j, 2 + 0j])
    assert uniform_ratio(z * 2, z) is None
    assert uniform_ratio(torch.zeros(0, dtype=D), torch.zeros(0, dtype=D)) is None


@pytest.mark.parametrize(("ratio", "sizes", "hint"), [
    (None, {"cp0": 2}, ""),
    (1.0, {"cp0": 2}, ""),
    (0.5, {"cp0": 2, "cp1": 1}, "CP = 0.5 x serial everywhere: mean vs sum over `cp0`?"),
    (0.5, {"cp0": 2, "cp1": 2},
     "CP = 0.5 x serial everywhere: mean vs sum over `cp0` or `cp1`?"),
    (0.25, {"cp0": 2, "cp1": 2},
     "CP = 0.25 x serial everywhere: mean vs sum over `cp0 x cp1`?"),
    (1 / 3, {"cp0": 1, "cp1": 3},
     "CP = 0.333 x serial everywhere: mean vs sum over `cp1`?"),
    (2.0, {"cp0": 2},
     "CP = 2 x serial everywhere: a sum where serial takes the mean (or counted twice) over "
     "`cp0`?"),
    (6.0, {"cp0": 2, "cp1": 3},
     "CP = 6 x serial everywhere: a sum where serial takes the mean (or counted twice) over "
     "`cp0 x cp1`?"),
    (-1.0, {"cp0": 2}, "CP = -1 x serial everywhere: a sign flipped?"),
    (-0.9995, {}, "CP = -1 x serial everywhere: a sign flipped?"),
    (3.0, {"cp0": 2}, "CP = 3 x serial everywhere: a missing or extra scale factor?"),
    (0.5, {}, "CP = 0.5 x serial everywhere: a missing or extra scale factor?"),
    (0.5, {"cp0": 1}, "CP = 0.5 x serial everywhere: a missing or extra scale factor?"),
    (0.0, {"cp0": 2}, ""),
    (-1.0011, {}, "CP = -1 x serial everywhere: a missing or extra scale factor?"),
    (2.0 * 1.0011, {"cp0": 2},
     "CP = 2 x serial everywhere: a missing or extra scale factor?"),
    (0.501, {"cp0": 2}, "CP = 0.501 x serial everywhere: a missing or extra scale factor?"),
    (2.0015, {"cp0": 2},
     "CP = 2 x serial everywhere: a sum where serial takes the mean (or counted twice) over "
     "`cp0`?"),
])
def test_ratio_hint(ratio: float | None, sizes: dict[str, int], hint: str) -> None:
    assert ratio_hint(ratio, sizes) == hint


def test_format_diffs_shows_shapes_in_one_line_hints_and_which_rule_judged() -> None:
    twin = _t(1.0, 2.0, 3.0)
    diffs = compare_named({
        "shape": (torch.zeros(2, dtype=D), twin.clone(), twin),
        "half": (twin * 0.5, twin.clone(), twin),
        "ok": (twin.clone(), twin.clone(), twin),
    }, FP32)
    text = format_diffs("param_grad", diffs, FP32, {"cp0": 2, "cp1": 1})
    lines = text.splitlines()
    assert lines[0] == f"param_grad: 2 of 3 tensors differ from serial ({FP32.describe()})"
    assert lines[1] == "  shape: shape (2,) != serial (3,)"
    assert lines[2].startswith("  half: max abs 1.5, max rel 0.5, 3/3 outside; |cp - twin|")
    assert lines[3] == "    CP = 0.5 x serial everywhere: mean vs sum over `cp0`?"
    assert len(lines) == 4
    table_only = compare_named({"t": (twin * 0.5, twin.clone())}, FP32)
    assert format_diffs("output", table_only, FP32).splitlines()[0] == (
        "output: 1 of 1 tensors differ from serial (rtol=1.3e-06, atol=1e-05 (table "
        "fp32/off/reference; no fp64 twin value))")
    assert format_diffs("output", table_only, FP32).splitlines()[2] == (
        "    CP = 0.5 x serial everywhere: a missing or extra scale factor?")


def test_twin_verdict_boundaries_are_inclusive() -> None:
    fp32, bf16 = FP32.twin, BF16.twin
    assert fp32 is not None and bf16 is not None
    # elementwise: exactly at the budget is inside (budget = 4 x 0.25 + 4 ulp at 1.0)
    twin, serial = _t(1.0, 0.0), _t(1.0, 0.25)
    budget = 1.0 + 4 * 2.0**-23
    name, bad, _, _, got = twin_verdict(_t(1.0, budget), serial, twin, fp32)
    assert (name, got, bad.tolist()) == ("twin", budget, [False, False])
    # the noise switch: a serial error of exactly half the scale is noise (norms)
    assert twin_verdict(_t(2.0, 0.0), _t(2.0, 1.0), _t(2.0, 0.0), fp32)[0] == "twin-norm"
    assert twin_verdict(_t(2.0, 0.0), _t(2.0, 0.99), _t(2.0, 0.0), fp32)[0] == "twin"
    # norms: exactly at the budget is inside (scale 0: no floor; 4 x ||(1,1,1,1)|| = 8)
    zeros = _t(0.0, 0.0, 0.0, 0.0)
    name, bad, cp_norm, serial_norm, got = twin_verdict(
        _t(4.0, 4.0, 4.0, 4.0), _t(1.0, 1.0, 1.0, 1.0), zeros, bf16)
    assert (name, cp_norm, serial_norm, got, bad.any().item()) == (
        "twin-norm", 8.0, 2.0, 8.0, False)
    assert bad.dtype == torch.bool and bad.shape == (4,)


def test_twin_verdict_norm_budget_adds_the_floor_times_sqrt_n() -> None:
    bf16 = BF16.twin
    assert bf16 is not None
    twin = _t(2.0, 0.0, 0.0, 0.0)                  # scale 2: floor 4 x 2^-7 x 2 = 1/16
    serial = _t(2.0, 1.0, 0.0, 0.0)                # worst error 1 = half the scale: noise
    name, _, _, serial_norm, budget = twin_verdict(serial, serial, twin, bf16)
    assert (name, serial_norm) == ("twin-norm", 1.0)
    assert budget == 4 * 1.0 + (4 * 2.0**-7 * 2.0) * 2.0  # sqrt(4) = 2


def test_twin_verdict_counts_only_usable_elements_and_equal_ones_as_zero_error() -> None:
    fp32 = FP32.twin
    assert fp32 is not None
    # a serial inf where the twin is finite: that element is not judged by closeness
    twin, serial = _t(1e-3, 2e-3, 1e-3), _t(1e-3, float("inf"), 1e-3)
    _, bad, twin_err, serial_err, budget = twin_verdict(_t(1e-3, 2e-3, 1e-3), serial,
                                                        twin, fp32)
    assert bad.tolist() == [False, True, False]  # CP finite where serial is not: differs
    assert serial_err == 0.0 and twin_err == INF
    assert budget == 4 * 2.0**-23 * 1e-3          # scale from the usable elements only
    # CP equal to serial everywhere: no error at all, whatever the twin says
    serial = twin + _t(1e-9, -1e-9, 0.0)
    _, bad, twin_err, *_ = twin_verdict(serial.clone(), serial, twin, fp32)
    assert twin_err == 0.0 and not bad.any()


def test_a_twin_of_the_wrong_kind_cannot_judge() -> None:
    real = torch.ones(2, dtype=D)
    (d,) = compare_named({"t": (real, real, real.to(torch.complex128))}, FP32)
    assert d.rule == "table"  # a complex twin for a real value computed something else
    z = torch.ones(2, dtype=torch.complex64)
    (d,) = compare_named({"t": (z, z, real)}, FP32)
    assert d.rule == "table"


def test_uniform_ratio_edges() -> None:
    # an element of exactly a tenth of the largest carries the value
    assert uniform_ratio(_t(5.0, 1.0, 5.0), _t(10.0, 1.0, 10.0)) is None
    # exactly 1% from the median is uniform (median 100, 101 at 1.0 away)
    assert uniform_ratio(_t(100.0, 101.0), _t(1.0, 1.0)) == 100.0
    assert uniform_ratio(_t(1.0, 2.0) / 3, _t(1.0, 2.0)) == 0.333333  # 6 digits
    assert uniform_ratio(torch.tensor([1.0 + 0j, 2.0]), _t(1.0, 2.0)) is None
    assert uniform_ratio(_t(1.0, 2.0), torch.tensor([1.0 + 0j, 2.0])) is None
