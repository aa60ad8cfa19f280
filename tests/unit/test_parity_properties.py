"""Property-based tests (hypothesis) of ``compare`` and ``tolerance``: random shapes and
dtypes (float, int, bool, complex), non-finite values, empty tensors, and a planted
difference that must be found wherever it is placed.

Derandomized and without an example database: the same examples on every run and every
machine (CI and the mutation run must agree), and nothing written into the checkout.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cpmatrix.parity import TOLERANCE_TABLE, Tolerance, ToleranceError, resolve_tolerance
from cpmatrix.parity.compare import compare_named

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
EXACT = (torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64)
COMPLEX = (torch.complex64, torch.complex128)
ROWS = list(TOLERANCE_TABLE.values())

shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)


@st.composite
def tensors(draw: Any, dtype: torch.dtype, shape: tuple[int, ...],
            nonfinite: bool = False) -> torch.Tensor:
    """A tensor of ``dtype`` and ``shape`` with values a CP test meets (|x| <= 100)."""
    n = math.prod(shape)
    if dtype is torch.bool:
        values: list[Any] = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    elif dtype in EXACT:
        low = 0 if dtype is torch.uint8 else -100
        values = draw(st.lists(st.integers(low, 100), min_size=n, max_size=n))
    else:
        real = st.floats(-100, 100, allow_nan=False, width=16)
        if nonfinite:
            real = real | st.sampled_from([math.inf, -math.inf, math.nan])
        if dtype in COMPLEX:
            values = draw(st.lists(st.builds(complex, real, real), min_size=n, max_size=n))
        else:
            values = draw(st.lists(real, min_size=n, max_size=n))
    return torch.tensor(values, dtype=dtype).reshape(shape)


def one(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance) -> Any:
    (diff,) = compare_named({"t": (actual, expected)}, tol)
    return diff


# --------------------------------------------------------------------------------------
# compare


@SETTINGS
@given(st.data(), st.sampled_from(FLOATS + EXACT + COMPLEX), shapes, st.sampled_from(ROWS))
def test_a_tensor_equals_its_copy(data: Any, dtype: torch.dtype, shape: tuple[int, ...],
                                  tol: Tolerance) -> None:
    e = data.draw(tensors(dtype, shape, nonfinite=True))
    diff = one(e.clone(), e, tol)
    nans = int(torch.isnan(e).sum()) if e.is_floating_point() or e.is_complex() else 0
    # NaN is never equal, not even to itself: everything else is
    assert (diff.ok, diff.bad, diff.numel) == (nans == 0, nans, e.numel())
    if nans == 0:
        assert diff.max_abs == 0.0 and diff.max_rel == 0.0


@SETTINGS
@given(st.data(), st.sampled_from(FLOATS + EXACT + COMPLEX), shapes, st.sampled_from(ROWS))
def test_a_planted_difference_is_found_wherever_it_is(
    data: Any, dtype: torch.dtype, shape: tuple[int, ...], tol: Tolerance,
) -> None:
    e = data.draw(tensors(dtype, shape))
    index = data.draw(st.integers(0, e.numel() - 1))
    a = e.clone().reshape(-1)
    if dtype is torch.bool:
        a[index] = not bool(a[index])
        gap = 1.0
    elif dtype in EXACT:
        a[index] = a[index] + 1  # one unit: the smallest integer difference
        gap = 1.0
    else:
        # far outside every row: |x| <= 100 and 2 + |x| > atol + rtol * |x|
        kind = data.draw(st.sampled_from(["far", "inf", "-inf", "nan", "imag"]))
        x = complex(a[index].item())
        if kind == "far" or (kind == "imag" and dtype not in COMPLEX):
            a[index] = a[index] + (2 + abs(x)) * (1 if x.real >= 0 else -1)
        elif kind == "imag":
            a[index] = a[index] + complex(0, 2 + abs(x))  # only the imaginary part moves
        else:
            a[index] = float(kind)
        gap = 2.0
    diff = one(a.reshape(shape), e, tol)
    assert (diff.ok, diff.bad, diff.numel) == (False, 1, e.numel()), (e, a)
    assert diff.max_abs >= gap * 0.99


@SETTINGS
@given(st.data(), st.sampled_from(FLOATS + COMPLEX), shapes, st.sampled_from(ROWS))
def test_infs_match_only_an_inf_of_the_same_sign(
    data: Any, dtype: torch.dtype, shape: tuple[int, ...], tol: Tolerance,
) -> None:
    e = data.draw(tensors(dtype, shape))
    index = data.draw(st.integers(0, e.numel() - 1))
    sign = data.draw(st.sampled_from([1.0, -1.0]))
    e.view(-1)[index] = sign * math.inf
    same = e.clone()
    assert one(same, e, tol).ok
    for other in (-sign * math.inf, 0.0, 1e4, math.nan):
        a = e.clone()
        a.view(-1)[index] = other
        # both ways round: an inf on either side never fits inside atol + rtol * |x|
        for actual, expected in ((a, e), (e, a)):
            diff = one(actual, expected, tol)
            assert not diff.ok and diff.bad == 1 and diff.max_abs == math.inf


@SETTINGS
@given(st.data(), shapes, st.sampled_from(ROWS),
       st.sampled_from([0.0, 0.5, 0.999, 1.001, 2.0, 1e3]))
def test_float64_verdict_is_assert_closes(
    data: Any, shape: tuple[int, ...], tol: Tolerance, scale: float,
) -> None:
    e = data.draw(tensors(torch.float64, shape, nonfinite=True))
    signs = data.draw(tensors(torch.int8, shape)).sign().to(torch.float64)
    a = e + scale * signs * (tol.atol + tol.rtol * e.abs())
    try:
        torch.testing.assert_close(a, e, rtol=tol.rtol, atol=tol.atol)
        expected_ok = True
    except AssertionError:
        expected_ok = False
    assert one(a, e, tol).ok is expected_ok


@SETTINGS
@given(st.data(), st.sampled_from(FLOATS + EXACT + COMPLEX), shapes, st.sampled_from(ROWS))
def test_a_pass_stays_a_pass_under_a_looser_tolerance(
    data: Any, dtype: torch.dtype, shape: tuple[int, ...], tol: Tolerance,
) -> None:
    e = data.draw(tensors(dtype, shape, nonfinite=True))
    a = data.draw(tensors(dtype, shape, nonfinite=True))
    looser = tol.loosen(rtol=tol.rtol * 10, atol=tol.atol * 10, reason="ten times the row")
    if one(a, e, tol).ok:
        assert one(a, e, looser).ok


@SETTINGS
@given(st.sampled_from(FLOATS + EXACT + COMPLEX), shapes, st.integers(0, 2),
       st.sampled_from(ROWS))
def test_empty_tensors_need_only_the_same_shape_and_dtype(
    dtype: torch.dtype, shape: tuple[int, ...], where: int, tol: Tolerance,
) -> None:
    empty = tuple(0 if i == where % max(len(shape), 1) else s for i, s in enumerate(shape))
    assume(0 in empty)
    e = torch.zeros(empty, dtype=dtype)
    assert one(torch.zeros(empty, dtype=dtype), e, tol).ok
    other = torch.float64 if dtype is not torch.float64 else torch.float32
    assert not one(torch.zeros(empty, dtype=other), e, tol).ok
    transposed = tuple(reversed(empty))
    if transposed != empty:
        diff = one(torch.zeros(transposed, dtype=dtype), e, tol)
        assert not diff.ok and diff.note.startswith("shape ")


@pytest.mark.parametrize("dtype", FLOATS + EXACT + COMPLEX)
def test_a_different_shape_is_a_mismatch_even_when_values_broadcast(dtype: torch.dtype) -> None:
    diff = one(torch.zeros(1, 3, dtype=dtype), torch.zeros(3, dtype=dtype), ROWS[0])
    assert not diff.ok and diff.bad == 3 and diff.note == "shape (1, 3) != serial (3,)"


@SETTINGS
@given(st.one_of(st.integers(), st.floats(allow_nan=True), st.text(max_size=5), st.none(),
                 st.booleans()),
       st.one_of(st.integers(), st.floats(allow_nan=True), st.text(max_size=5), st.none(),
                 st.booleans()))
def test_non_tensor_leaves_are_equal_exactly_when_python_says_so(actual: Any,
                                                                 expected: Any) -> None:
    (diff,) = compare_named({"leaf": (actual, expected)}, ROWS[0])
    assert diff.ok is bool(actual == expected)
    assert diff.ok or diff.note  # a mismatch always says why


# --------------------------------------------------------------------------------------
# tolerance


reasons = st.text(alphabet=st.sampled_from("ab .\t"), max_size=20)
numbers = st.floats(0, 1, allow_nan=False) | st.sampled_from([0.0, 1e-9, 1e-7, 1.6e-2])


@SETTINGS
@given(st.sampled_from(list(TOLERANCE_TABLE)), numbers, numbers, reasons)
def test_resolve_accepts_a_tolerance_iff_it_is_not_looser_or_has_a_reason(
    key: tuple[str, bool, str], rtol: float, atol: float, reason: str,
) -> None:
    dtype, autocast, path = key
    row = TOLERANCE_TABLE[key]
    asked = Tolerance(rtol=rtol, atol=atol, reason=reason)
    looser = rtol > row.rtol or atol > row.atol
    text = reason.strip()
    written = len(text) >= 12 and len(text.split()) >= 3
    assert asked.is_looser_than(row) is looser
    if looser and not written:
        with pytest.raises(ToleranceError):
            resolve_tolerance(asked, dtype=dtype, autocast=autocast, path=path)
    else:
        assert resolve_tolerance(asked, dtype=dtype, autocast=autocast, path=path) is asked


@SETTINGS
@given(st.sampled_from(ROWS), numbers | st.none(), numbers | st.none(), reasons)
def test_loosen_needs_a_written_reason_and_keeps_what_it_is_not_given(
    row: Tolerance, rtol: float | None, atol: float | None, reason: str,
) -> None:
    text = reason.strip()
    if not (len(text) >= 12 and len(text.split()) >= 3):
        with pytest.raises(ToleranceError, match="needs a written reason"):
            row.loosen(rtol=rtol, atol=atol, reason=reason)
        return
    new = row.loosen(rtol=rtol, atol=atol, reason=reason)
    assert new.rtol == (row.rtol if rtol is None else rtol)
    assert new.atol == (row.atol if atol is None else atol)
    assert (new.why, new.reason, new.source) == (row.why, text, f"loosened from {row.source}")


@SETTINGS
@given(st.sampled_from(ROWS),
       st.sampled_from([math.nan, math.inf, -math.inf, -1e-9, -1.0]),
       st.booleans())
def test_a_tolerance_is_a_finite_number_at_least_zero(row: Tolerance, bad: float,
                                                      on_rtol: bool) -> None:
    kwargs = {"rtol": bad} if on_rtol else {"atol": bad}
    with pytest.raises(ToleranceError, match="must be a finite number >= 0"):
        row.loosen(**kwargs, reason="a long enough written reason")
    with pytest.raises(ToleranceError, match="must be a finite number >= 0"):
        resolve_tolerance(Tolerance(rtol=kwargs.get("rtol", 0.0), atol=kwargs.get("atol", 0.0)),
                          dtype="fp64")
