"""``last-failed.json`` (cpmatrix.report.last_failed): what ``repro --failed`` reruns is,
cell by cell, the failures of the last run that ran the cell."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from cpmatrix.layout import RunLayout
from cpmatrix.report import last_failed
from cpmatrix.report.last_failed import read_last_failed, update_last_failed
from cpmatrix.result import Result, Status


def _r(cell: str, status: Status, mutant: str = "") -> Result:
    return Result(cell_id=cell, status=status, mutant=mutant)


def _failed(out: Path) -> list[tuple[str, str, str]]:
    return [(e.cell_id, e.mutant, e.status) for e in read_last_failed(out) or []]


def test_a_later_run_of_other_cells_keeps_the_failures(tmp_path: Path) -> None:
    update_last_failed(tmp_path, [_r("a", Status.FAILED), _r("b", Status.CRASH),
                                  _r("c", Status.PASSED)], at=1.0)
    update_last_failed(tmp_path, [_r("c", Status.FAILED)], at=2.0)  # run -k c
    update_last_failed(tmp_path, [], at=3.0)  # a run that ran nothing
    assert _failed(tmp_path) == [("a", "", "failed"), ("b", "", "crash"),
                                 ("c", "", "failed")]


def test_a_pass_clears_and_an_unrun_cell_keeps_its_entry(tmp_path: Path) -> None:
    update_last_failed(tmp_path, [_r("a", Status.FAILED), _r("b", Status.TIMEOUT),
                                  _r("c", Status.FLAKY), _r("a", Status.SURVIVED, "m")],
                       at=1.0)
    update_last_failed(tmp_path, [_r("a", Status.CACHED), _r("b", Status.INTERRUPTED),
                                  _r("c", Status.SKIPPED), _r("a", Status.KILLED, "m")],
                       at=2.0)
    assert _failed(tmp_path) == [("b", "", "timeout"), ("c", "", "flaky")]


def test_no_record_is_none_and_a_damaged_one_is_an_error(tmp_path: Path) -> None:
    assert read_last_failed(tmp_path) is None
    RunLayout(tmp_path).last_failed.write_text("{not json")
    with pytest.raises(ValueError, match=r"last-failed\.json"):
        read_last_failed(tmp_path)
    update_last_failed(tmp_path, [_r("a", Status.FAILED)], at=1.0)  # started afresh
    assert _failed(tmp_path) == [("a", "", "failed")]


def test_docstring_examples_hold() -> None:
    result = doctest.testmod(last_failed)
    assert result.attempted > 0 and result.failed == 0
