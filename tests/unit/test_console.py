"""The end-of-run summary: failures one block each, skipped cells one line per reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpmatrix.cli.console import format_summary
from cpmatrix.result import FailureKind, Result, Status
from cpmatrix.supervise.run_report import RunReport


def test_skipped_cells_are_counted_by_reason_not_listed_as_failures() -> None:
    why2 = "not run: needs 2 GPUs (one per rank); 1 visible"
    why4 = "not run: needs 4 GPUs (one per rank); 1 visible"
    results = {
        "a": Result(cell_id="a", status=Status.PASSED),
        "b": Result(cell_id="b", status=Status.FAILED, kind=FailureKind.ERROR,
                    failing_ranks=(0,), message="boom"),
        "c": Result(cell_id="c", status=Status.SKIPPED, message=why2),
        "d": Result(cell_id="d", status=Status.SKIPPED, message=why2),
        "e": Result(cell_id="e", status=Status.SKIPPED, message=why4),
    }
    text = format_summary(RunReport(results=results, wall_s=1.0, planned={"world": 1},
                                    starts={"world": 1}, world_jobs=frozenset({"world"}),
                                    report_path=Path("out/report.xml")),
                          "out")
    lines = text.splitlines()
    assert "==== 1 not passed ====" in lines
    assert "FAILED b" in lines
    assert not any(ln.startswith("SKIPPED") for ln in lines)
    assert lines[lines.index("==== 3 skipped ====") + 1:][:2] == [
        f"  2 cells {why2}", f"  1 cells {why4}"]
    assert "==== 5 cells: 1 passed, 1 failed, 3 skipped in 1.0 s" in text


@pytest.mark.parametrize(("worlds", "starts", "words"), [
    (1, 1, "(1 planned world, 1 world start)"),
    (2, 3, "(2 planned worlds, 3 world starts)"),
])
def test_the_summary_counts_worlds_in_singular_and_plural(worlds: int, starts: int,
                                                          words: str) -> None:
    report = RunReport(results={"a": Result(cell_id="a", status=Status.PASSED)}, wall_s=1.0,
                       planned={"world": worlds, "compile": 5},
                       starts={"world": starts, "compile": 5},
                       world_jobs=frozenset({"world"}), report_path=Path("out/report.xml"))
    assert words in format_summary(report, "out")
