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
    table_markdown,
    tolerance_for,
)
from cpmatrix.parity.tolerance import TWIN_FACTOR, TWIN_FLOOR_ULPS, TwinRule


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
        fixed = f"rtol={tol.rtol:.3g}, atol={tol.atol:.3g} ({tol.source})"
        if dtype == "fp64":  # fp64 rows are fixed; every other row is the fp64 twin rule
            assert tol.twin is None and tol.describe() == fixed
        else:
            assert tol.twin is not None
            assert tol.describe() == f"{tol.twin.describe()}; where no twin: {fixed}"


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
        tolerance_for("fp64").loosen(atol=1.0, reason="flaky")
    assert str(info.value).startswith(
        "loosening rtol=1e-07, atol=1e-07 (table fp64/off/reference) needs a written reason")
    with pytest.raises(ToleranceError) as info:
        tolerance_for("bf16").loosen(factor=8, reason="flaky")
    assert str(info.value).startswith("loosening fp64 twin: |cp - twin| <= 4 x")
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


# --------------------------------------------------------------------------------------
# the fp64 twin rule (issue 22): fp32/bf16/fp16 rows carry it, fp64 rows are fixed


@pytest.mark.parametrize(("dtype", "autocast", "path", "precision", "eps"), [
    ("fp32", False, "reference", "fp32", 2.0**-23),
    ("fp32", True, "reference", "bf16", 2.0**-7),   # autocast computes in bf16 on CPU
    ("fp32", False, "kernel", "tf32", 2.0**-10),    # Triton's fp32 tl.dot
    ("bf16", False, "reference", "bf16", 2.0**-7),
    ("bf16", True, "kernel", "bf16", 2.0**-7),
    ("fp16", False, "reference", "fp16", 2.0**-10),
])
def test_low_precision_rows_carry_the_twin_rule_in_their_compute_precision(
    dtype: str, autocast: bool, path: str, precision: str, eps: float,
) -> None:
    twin = tolerance_for(dtype, autocast, path).twin
    assert twin is not None
    assert (twin.factor, twin.floor_ulps, twin.precision, twin.eps) == (
        TWIN_FACTOR, TWIN_FLOOR_ULPS, precision, eps)
    assert tolerance_for("fp64", autocast, path).twin is None


def test_the_budget_is_factor_times_the_serial_error_plus_a_floor_at_the_scale() -> None:
    rule = TwinRule(factor=4.0, floor_ulps=4.0, precision="bf16")
    assert rule.floor(2.0) == 4 * 2.0**-7 * 2.0
    assert rule.budget(serial_err=0.5, scale=0.0) == 2.0
    assert rule.budget(serial_err=0.0, scale=1.0) == 4 * 2.0**-7
    assert rule.budget(serial_err=1e-3, scale=3.0) == 4e-3 + 4 * 2.0**-7 * 3.0
    assert rule.describe() == ("fp64 twin: |cp - twin| <= 4 x max|serial - twin| + 4 ulp "
                               "(bf16, eps 2^-7) x max|twin|")


def test_loosening_the_twin_factor_needs_a_reason_and_keeps_the_rule() -> None:
    base = tolerance_for("bf16")
    reason = "the CP side sums in a different order over 64 ranks"
    looser = base.loosen(factor=8, reason=reason)
    assert looser.twin is not None and looser.twin.factor == 8.0
    assert looser.twin.precision == "bf16" and looser.twin.floor_ulps == TWIN_FLOOR_ULPS
    assert (looser.rtol, looser.atol) == (base.rtol, base.atol)
    assert resolve_tolerance(looser, dtype="bf16") is looser
    assert looser.is_looser_than(base) and not base.is_looser_than(looser)
    with pytest.raises(ToleranceError, match="needs a written reason"):
        base.loosen(factor=8, reason="flaky")


def test_a_bigger_twin_factor_or_floor_built_directly_is_refused_at_use() -> None:
    base = tolerance_for("fp32")
    assert base.twin is not None
    for twin in (TwinRule(factor=5.0, floor_ulps=4.0, precision="fp32"),
                 TwinRule(factor=4.0, floor_ulps=5.0, precision="fp32"),
                 TwinRule(factor=4.0, floor_ulps=4.0, precision="bf16")):
        smuggled = Tolerance(rtol=base.rtol, atol=base.atol, twin=twin)
        with pytest.raises(ToleranceError, match="looser than the table fp32/off/reference"):
            resolve_tolerance(smuggled, dtype="fp32")
    tighter = Tolerance(rtol=base.rtol, atol=base.atol,
                        twin=TwinRule(factor=2.0, floor_ulps=1.0, precision="fp32"))
    assert resolve_tolerance(tighter, dtype="fp32") is tighter


def test_loosening_rtol_or_atol_makes_a_fixed_tolerance() -> None:
    reason = "a hand-written kernel with its own documented error bound"
    fixed = tolerance_for("bf16").loosen(atol=0.05, reason=reason)
    assert fixed.twin is None and fixed.atol == 0.05
    assert fixed.describe().startswith("rtol=0.016, atol=0.05 (loosened from table bf16")
    with pytest.raises(ToleranceError, match="needs an fp64 twin rule"):
        tolerance_for("fp64").loosen(factor=8, reason=reason)


@pytest.mark.parametrize("twin", [
    TwinRule(factor=-1.0, floor_ulps=4.0, precision="fp32"),
    TwinRule(factor=float("nan"), floor_ulps=4.0, precision="fp32"),
    TwinRule(factor=4.0, floor_ulps=float("inf"), precision="fp32"),
    TwinRule(factor=4.0, floor_ulps=4.0, precision="fp8"),
])
def test_a_twin_rule_with_invalid_numbers_is_refused(twin: TwinRule) -> None:
    with pytest.raises(ToleranceError, match="twin"):
        resolve_tolerance(Tolerance(rtol=0.0, atol=0.0, twin=twin), dtype="fp32")


def test_the_markdown_table_names_the_default_rule_of_each_row() -> None:
    rows = table_markdown().splitlines()
    assert rows[0].startswith("| dtype | autocast | path | default rule | fixed rtol |")
    assert "| fp64 | off | reference | fixed | 1e-07 | 1e-07 |" in table_markdown()
    assert "| bf16 | off | reference | fp64 twin (bf16 ulp) | 0.016 | 0.016 |" in table_markdown()
    assert "| fp32 | off | kernel | fp64 twin (tf32 ulp) |" in table_markdown()


@pytest.mark.parametrize(("tol", "name"), [
    (Tolerance(rtol=-1.0, atol=0.0), "rtol"),
    (Tolerance(rtol=0.0, atol=float("nan")), "atol"),
    (Tolerance(rtol=0.0, atol=0.0, twin=TwinRule(factor=-1, floor_ulps=1, precision="bf16")),
     "twin factor"),
    (Tolerance(rtol=0.0, atol=0.0, twin=TwinRule(factor=1, floor_ulps=-1, precision="bf16")),
     "twin floor_ulps"),
])
def test_an_invalid_number_is_named(tol: Tolerance, name: str) -> None:
    with pytest.raises(ToleranceError) as info:
        resolve_tolerance(tol, dtype="bf16")
    assert str(info.value).startswith(f"tolerance {name} must be a finite number >= 0, got ")


def test_the_same_twin_rule_is_not_looser() -> None:
    base = tolerance_for("bf16")
    same = Tolerance(rtol=base.rtol, atol=base.atol, twin=base.twin)
    assert not same.is_looser_than(base) and not base.is_looser_than(same)
    assert resolve_tolerance(same, dtype="bf16") is same
    both = base.loosen(factor=8, atol=0.05, reason="a fixed budget is what the kernel has")
    assert both.twin is None and both.atol == 0.05  # rtol/atol given: fixed
