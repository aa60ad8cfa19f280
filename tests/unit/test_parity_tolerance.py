"""The tolerance table and the loosening rule (no process group needed)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.testing._comparison import default_tolerances

from cpmatrix.parity import (
    TOLERANCE_TABLE,
    Tolerance,
    ToleranceError,
    resolve_tolerance,
    tolerance_for,
)


@pytest.mark.parametrize(("name", "dtype"), [("fp64", torch.float64), ("fp32", torch.float32)])
def test_reference_rows_are_assert_close_defaults(name: str, dtype: torch.dtype) -> None:
    rtol, atol = default_tolerances(torch.empty((), dtype=dtype))
    tol = tolerance_for(name, autocast=False, path="reference")
    assert (tol.rtol, tol.atol) == (rtol, atol)


def test_every_cell_has_exactly_one_row_with_a_reason() -> None:
    keys = set(itertools.product(("fp64", "fp32", "bf16", "fp16"), (False, True),
                                 ("reference", "kernel")))
    assert set(TOLERANCE_TABLE) == keys
    for key, tol in TOLERANCE_TABLE.items():
        assert tol.why and tol.reason is None, key
        assert math.isfinite(tol.rtol) and math.isfinite(tol.atol)


@pytest.mark.parametrize("spelling", [torch.float64, "float64", "fp64", "double"])
def test_dtype_spellings(spelling: object) -> None:
    assert tolerance_for(spelling) is TOLERANCE_TABLE[("fp64", False, "reference")]


def test_autocast_never_changes_fp64_and_loosens_fp32() -> None:
    assert tolerance_for("fp64", "on") == tolerance_for("fp64", "off").__class__(
        rtol=1e-7, atol=1e-7, why=tolerance_for("fp64", "on").why,
        source="table fp64/on/reference")
    assert tolerance_for("fp32", True).rtol > tolerance_for("fp32", False).rtol


def test_unknown_dtype_or_path_is_an_error_naming_the_allowed_values() -> None:
    with pytest.raises(ValueError, match="allowed: bf16, fp16, fp32, fp64"):
        tolerance_for(torch.int64)
    with pytest.raises(ValueError, match="allowed: reference, kernel"):
        tolerance_for("fp64", path="triton")


# --------------------------------------------------------------------------------------
# loosening


def test_loosening_without_a_reason_is_refused() -> None:
    base = tolerance_for("fp64")
    for reason in ("", "   ", "flaky", "tbd tbd", "x" * 40):
        with pytest.raises(ToleranceError, match="needs a written reason") as info:
            base.loosen(atol=1e-5, reason=reason)
        assert info.value.check == "tolerance"


def test_a_looser_tolerance_built_directly_is_refused_at_use() -> None:
    # Tolerance(...) skips loosen(); resolve_tolerance, which check_parity calls, refuses it.
    with pytest.raises(ToleranceError, match="looser than the table fp64/off/reference row"):
        resolve_tolerance(Tolerance(rtol=1e-7, atol=1e-6), dtype=torch.float64)
    with pytest.raises(ToleranceError, match="looser"):
        resolve_tolerance(Tolerance(rtol=1e-3, atol=1e-7), dtype="fp64")
    # A reason smuggled in directly is judged the same way.
    with pytest.raises(ToleranceError):
        resolve_tolerance(Tolerance(rtol=1e-3, atol=1e-3, reason="ok"), dtype="fp64")


def test_loosening_with_a_reason_is_allowed_and_carries_it() -> None:
    reason = "sums 4096 terms in one reduction: budget n * eps * max|x|"
    tol = tolerance_for("fp64").loosen(atol=1e-6, reason=reason)
    used = resolve_tolerance(tol, dtype="fp64")
    assert used.atol == 1e-6 and used.rtol == 1e-7
    assert used.reason == reason
    assert "loosened from table fp64/off/reference" in used.describe()
    assert reason in used.describe()


def test_tightening_needs_no_reason() -> None:
    tight = Tolerance(rtol=1e-9, atol=0.0)
    assert resolve_tolerance(tight, dtype="fp64") is tight


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1e-3])
def test_nonsense_numbers_are_refused(bad: float) -> None:
    with pytest.raises(ToleranceError, match="finite number >= 0"):
        tolerance_for("fp64").loosen(atol=bad, reason="a perfectly good reason here")


def test_every_row_says_where_it_came_from() -> None:
    for (dtype, autocast, path), tol in TOLERANCE_TABLE.items():
        assert tol.source == f"table {dtype}/{'on' if autocast else 'off'}/{path}"
        assert tol.describe() == f"rtol={tol.rtol:.3g}, atol={tol.atol:.3g} ({tol.source})"


def test_loosening_keeps_the_rows_why_and_only_the_numbers_given() -> None:
    base = tolerance_for("fp32", path="kernel")
    reason = "a tiled reduction adds one rounding per tile"
    only_rtol = base.loosen(rtol=0.01, reason=reason)
    assert (only_rtol.rtol, only_rtol.atol) == (0.01, base.atol)
    only_atol = base.loosen(atol=0.05, reason=reason)
    assert (only_atol.rtol, only_atol.atol) == (base.rtol, 0.05)
    both = base.loosen(rtol=1, atol=2, reason=f"  {reason}  ")
    assert (both.rtol, both.atol) == (1.0, 2.0) and isinstance(both.rtol, float)
    assert both.why == base.why and both.reason == reason  # stripped
    assert both.source == "loosened from table fp32/off/kernel"


def test_a_refused_loosening_names_what_was_loosened() -> None:
    with pytest.raises(ToleranceError) as info:
        tolerance_for("bf16").loosen(atol=1.0, reason="flaky")
    assert str(info.value).startswith(
        "loosening rtol=0.016, atol=0.016 (table bf16/off/reference) needs a written reason")
    assert "got 'flaky'" in str(info.value)


@pytest.mark.parametrize(
    ("reason", "ok"),
    [
        ("abc def ghij", True),     # 12 characters, 3 words: the least accepted
        ("abc def ghi", False),     # 11 characters
        ("abcdefghijk lmnop", False),  # 2 words
        ("  abc def ghij  ", True),  # surrounding blanks do not count, nor hurt
        (None, False),
        (42, False),
    ],
)
def test_the_shortest_reason_is_three_words_and_twelve_characters(reason: object, ok: bool) -> None:
    loose = Tolerance(rtol=1e-3, atol=1e-3, reason=reason)  # type: ignore[arg-type]
    if ok:
        assert resolve_tolerance(loose, dtype="fp64") is loose
    else:
        with pytest.raises(ToleranceError):
            resolve_tolerance(loose, dtype="fp64")
        with pytest.raises(ToleranceError):
            tolerance_for("fp64").loosen(atol=1e-3, reason=reason)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rtol", "atol", "looser"),
    [(1e-7, 1e-7, False), (1e-8, 1e-7, False), (1e-7, 1e-8, False), (2e-7, 1e-8, True),
     (1e-8, 2e-7, True)],
)
def test_looser_means_a_larger_rtol_or_a_larger_atol(rtol: float, atol: float,
                                                     looser: bool) -> None:
    assert Tolerance(rtol=rtol, atol=atol).is_looser_than(tolerance_for("fp64")) is looser
    # the table's own numbers, rebuilt without a reason, are not looser: accepted
    if not looser:
        resolve_tolerance(Tolerance(rtol=rtol, atol=atol), dtype="fp64")


def test_resolve_uses_the_cells_autocast_and_path_row() -> None:
    autocast_row = Tolerance(rtol=1.6e-2, atol=1.6e-2)
    assert resolve_tolerance(autocast_row, dtype="fp32", autocast=True) is autocast_row
    assert resolve_tolerance(autocast_row, dtype="fp32", autocast="on") is autocast_row
    with pytest.raises(ToleranceError, match="table fp32/off/reference row"):
        resolve_tolerance(autocast_row, dtype="fp32", autocast=False)
    kernel_row = Tolerance(rtol=2e-3, atol=2e-3)
    assert resolve_tolerance(kernel_row, dtype="fp32", path="kernel") is kernel_row
    with pytest.raises(ToleranceError, match="table fp32/off/reference row"):
        resolve_tolerance(kernel_row, dtype="fp32")
    assert resolve_tolerance(None, dtype="bf16", autocast="on", path="kernel") is (
        TOLERANCE_TABLE[("bf16", True, "kernel")])


def test_autocast_must_be_a_bool_or_on_off() -> None:
    with pytest.raises(ValueError) as info:
        tolerance_for("fp32", autocast="yes")
    assert str(info.value) == "autocast must be a bool or 'on'/'off', got 'yes'"
