"""Issue 30, row 5, through the real CLI: a cell turning off the mha fast path and the
JIT profiling executor does not fail the cell after it, in matrix or reverse order."""

from __future__ import annotations

import pytest

from cli_runner import RES, results_by_target, run_cli

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("order", ["matrix", "reverse"])
def test_torch_flags_a_cell_leaves_are_put_back(tmp_path, order: str) -> None:
    out = tmp_path / "out"
    proc = run_cli("run", "--matrix", str(RES / "flags_order.yaml"), "--pack", "serial",
                   "--order", order, "--no-cache", "--plain", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by = results_by_target(out)
    assert {t: r["status"] for t, r in by.items()} == {
        "f0_expect_defaults": "passed", "f1_leave_flags": "passed",
        "f2_expect_defaults": "passed"}
