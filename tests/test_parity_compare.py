"""compare_named: assert_close's criterion, over a whole named set, with every mismatch."""

from __future__ import annotations

import pytest
import torch

from cpmatrix.parity import compare_named, format_diffs, tolerance_for
from cpmatrix.parity.compare import flatten

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
