"""A failed cell read once (cpmatrix.cli.failures): ranks with one traceback grouped, your
frames only, the evidence by rank (failing first), the repro line; the terminal's
summary table; cell names by prefix (cpmatrix.cli.cellref)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpmatrix.cli.cellref import Ambiguous, NotFound, resolve_id
from cpmatrix.cli.console import format_summary
from cpmatrix.cli.failures import failure_block, rank_ranges, trim_traceback
from cpmatrix.report.repro_line import repro_command
from cpmatrix.result import FailureKind, RankFailure, Result, Status
from cpmatrix.supervise.executors.attribution import merge_evidence
from cpmatrix.supervise.run_report import RunReport

CPM = "/site/cpmatrix"
TB = f"""\
Traceback (most recent call last):
  File "{CPM}/worker/case.py", line 120, in run_cell
    case(ctx)
  File "/home/me/proj/cases.py", line 15, in allreduce_sum
    check_parity(cell, serial, cp,
  File "{CPM}/parity/run.py", line 80, in check_parity
    _verdict(...)
  File "{CPM}/parity/verdict.py", line 12, in _verdict
    raise ParityError(msg)
cpmatrix.parity.errors.ParityError: out: max abs {{err}} > atol 1e-07
"""
IMPORT_TB = """\
Traceback (most recent call last):
  File "/site/cpmatrix/worker/case.py", line 108, in run_cell
    case, case_file = _import_case(spec.case, spec.case_file)
  File "/usr/lib/python3.11/importlib/__init__.py", line 126, in import_module
    return _bootstrap._gcd_import(name[level:], package, level)
  File "<frozen importlib._bootstrap>", line 1204, in _gcd_import
  File "<frozen importlib._bootstrap>", line 1176, in _find_and_load
  File "/home/me/proj/cases.py", line 3, in <module>
    import nosuchthing
ModuleNotFoundError: No module named 'nosuchthing'
"""


def failure(rank: int, err: str = "0.5") -> RankFailure:
    tb = TB.format(err=err)
    return RankFailure(rank=rank, message=tb.splitlines()[-1].split(": ", 1)[1],
                       traceback=tb, check="output")


def test_cpmatrix_and_importlib_frames_are_hidden_yours_kept() -> None:
    lines = trim_traceback(TB.format(err="0.5"))
    text = "\n".join(lines)
    assert 'File "/home/me/proj/cases.py", line 15, in allreduce_sum' in text
    assert "    check_parity(cell, serial, cp," in lines  # your call line, whole
    assert CPM not in text
    assert "  (1 frame of cpmatrix hidden; --full-trace shows it)" in lines
    assert "  (2 frames of cpmatrix hidden; --full-trace shows them)" in lines
    assert lines[-1].startswith("cpmatrix.parity.errors.ParityError")
    assert trim_traceback(TB, full=True) == TB.rstrip("\n").splitlines()


def test_an_import_error_shows_your_frame_first() -> None:
    lines = trim_traceback(IMPORT_TB)
    shown = [ln for ln in lines if ln.lstrip().startswith("File ")]
    assert shown == ['  File "/home/me/proj/cases.py", line 3, in <module>']
    assert "  (3 frames of importlib hidden; --full-trace shows them)" in lines


def test_four_ranks_with_one_traceback_are_printed_once_naming_them() -> None:
    r = Result(cell_id="t@cpu", status=Status.FAILED, kind=FailureKind.ERROR,
               failing_ranks=(0, 1, 2, 3),
               failures=tuple(failure(k, err=f"0.{k + 1}") for k in range(4)))
    block = failure_block("t@cpu", r)
    assert sum("Traceback (most recent call last):" in ln for ln in block) == 1
    head = next(ln for ln in block if ln.startswith("  ranks "))
    assert head.startswith("  ranks 0-3: out: max abs 0.1 > atol 1e-07  [check: output]")
    assert "numbers differ: rank 0's shown" in head


def test_different_tracebacks_are_each_shown_with_their_ranks() -> None:
    other = RankFailure(rank=2, message="RuntimeError: boom",
                        traceback='Traceback (most recent call last):\n  File "/me/c.py", '
                        'line 1, in f\n    boom()\nRuntimeError: boom\n')
    r = Result(cell_id="t@cpu", status=Status.FAILED, kind=FailureKind.ERROR,
               failing_ranks=(0, 1, 2), failures=(failure(0), failure(1), other))
    heads = [ln for ln in failure_block("t@cpu", r) if ln.startswith("  rank")]
    assert heads[0].startswith("  ranks 0-1: ") and heads[1].startswith("  rank 2: ")
    assert "numbers differ" not in heads[0]  # the same text exactly


@pytest.mark.parametrize(("ranks", "text"), [
    ([3], "rank 3"), ([1, 2, 3], "ranks 1-3"), ([0, 1, 2, 5], "ranks 0-2, 5"),
    ([4, 0, 2], "ranks 0, 2, 4")])
def test_rank_ranges(ranks: list[int], text: str) -> None:
    assert rank_ranges(ranks) == text


def test_a_failed_cells_evidence_is_labelled_by_rank_failing_first() -> None:
    # rank 0 passed with err 0.0; ranks 1 and 2 failed: no bare 0.0 may stand for the cell
    merged = merge_evidence([{"err": 0.0, "n": 8}, {"err": 1.0, "n": 8}, {"err": 1.0, "n": 8}],
                            ranks=[0, 1, 2], failing=[1, 2])
    assert merged == {"err@rank1": 1.0, "err@rank2": 1.0, "err@rank0": 0.0, "n": 8}
    assert next(iter(merged)) == "err@rank1"
    # a rank that recorded nothing: the others are labelled with their own ranks
    assert merge_evidence([{"e": 2.0}, {"e": 3.0}], ranks=[4, 6], failing=[6]) == {
        "e@rank6": 3.0, "e@rank4": 2.0}
    # a passing cell keeps the old form: rank 0's value, the ranks that differ labelled
    assert merge_evidence([{"e": 0.0}, {"e": 1.0}]) == {"e": 0.0, "e@rank1": 1.0}
    r = Result(cell_id="t@cpu", status=Status.FAILED, failing_ranks=(1, 2),
               failures=(failure(1), failure(2)), evidence=merged)
    lines = [ln for ln in failure_block("t@cpu", r) if "evidence" in ln]
    assert lines == ["  evidence (all ranks): n = 8",
                     "  evidence ranks 1-2 (failed): err = 1.0",
                     "  evidence rank 0: err = 0.0"]


def test_the_block_ends_with_the_repro_line_quoted_for_a_shell() -> None:
    cell = "t[unit,2x2,fp64,autocast=off,reference]@cpu"
    line = repro_command(cell, "", ("--matrix", "my dir/m.yaml"))
    assert line == ("cpmatrix repro 't[unit,2x2,fp64,autocast=off,reference]@cpu' "
                    "--matrix 'my dir/m.yaml'")
    r = Result(cell_id=cell, status=Status.FAILED, failures=(failure(0),), repro=line)
    assert failure_block(cell, r)[-1] == f"  repro: {line}"
    assert Result.from_dict(r.to_dict()) == r
    assert "repro" not in Result(cell_id=cell, status=Status.PASSED).to_dict()


def test_the_summary_has_a_table_per_target_and_the_slowest_cells() -> None:
    results = {
        "a[1]@cpu": Result(cell_id="a[1]@cpu", status=Status.PASSED, duration_s=1.0),
        "a[2]@cpu": Result(cell_id="a[2]@cpu", status=Status.FAILED, duration_s=3.0,
                           failing_ranks=(0,), failures=(failure(0),)),
        "b[1]@cpu": Result(cell_id="b[1]@cpu", status=Status.SKIPPED, message="not run"),
    }
    text = format_summary(RunReport(results=results, wall_s=4.0, report_path=Path("r.xml")),
                          "out", slowest=1)
    lines = text.splitlines()
    head = lines.index("target  cells  passed  failed  skipped   time")
    assert lines[head + 1:head + 3] == ["a           2       1       1        0  4.0 s",
                                        "b           1       0       0        1  0.0 s"]
    assert lines[lines.index("==== slowest 1 cells ====") + 1] == "      3.00 s  a[2]@cpu"
    assert "slowest" not in format_summary(
        RunReport(results=results, wall_s=4.0, report_path=Path("r.xml")), "out")


IDS = ["t[unit,1x2,fp64]@cpu", "t[unit,2x2,fp64]@cpu", "u[unit,1x1,fp64]@cpu"]


def test_a_cell_is_named_by_a_prefix_of_exactly_one_id() -> None:
    assert resolve_id("t[unit,2x2", IDS) == "t[unit,2x2,fp64]@cpu"
    assert resolve_id("u", IDS) == "u[unit,1x1,fp64]@cpu"
    assert resolve_id(IDS[0], IDS) == IDS[0]
    with pytest.raises(Ambiguous, match=r"'t\[' names 2 cells: t\[unit,1x2,fp64\]@cpu, "):
        resolve_id("t[", IDS)
    with pytest.raises(NotFound) as missing:
        resolve_id("t[unit,3x3,fp64]@cpu", IDS)
    assert missing.value.near and missing.value.near[0].startswith("t[unit,")
