"""Trust without worlds (issue 11): odd input that crashed a run or misread a report.

Resource limits at load time, the gate's reading of a report and of gates.yaml, cache
entries of the wrong shape, text XML cannot hold, and files from another run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from junitparser import JUnitXml

from cpmatrix.cache.key import ResultCache
from cpmatrix.cli import main
from cpmatrix.errors import SpecError
from cpmatrix.gate import gate_main, load_policies
from cpmatrix.report import read_report
from cpmatrix.report.junit import merge_junit, results_to_junit, write_junit
from cpmatrix.result import FailureKind, RankFailure, Result, Status
from matrix_files import HEAD, write_matrix


def _run_list(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(["list", "--matrix", str(path)])
    return rc, capsys.readouterr().err


# ------------------------------------------------------------------- resource limits


def test_a_mesh_beyond_the_platforms_rank_limit_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_matrix(tmp_path, HEAD + "targets:\n  - {name: a, case: 'tiny:ok', "
                        "level: unit, axes: {mesh: [2x2, 100x100]}}\n")
    rc, err = _run_list(path, capsys)
    assert rc == 2, err
    assert f"{path}:6:" in err and "10000 ranks" in err and "max_ranks (64)" in err, err
    # The limit is the platform's, and raising it on purpose works.
    raised = HEAD.replace("device: cpu}", "device: cpu, max_ranks: 10000}")
    assert raised != HEAD
    path.write_text(raised + "targets:\n"
                    "  - {name: a, case: 'tiny:ok', level: unit, axes: {mesh: [100x100]}}\n")
    assert main(["list", "--matrix", str(path)]) == 0


def test_an_include_mesh_beyond_the_limit_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_matrix(tmp_path, HEAD + "targets:\n  - {name: a, case: 'tiny:ok', level: unit}\n"
                        "include:\n  - {target: a, mesh: 9x9}\n")
    rc, err = _run_list(path, capsys)
    assert rc == 2 and "81 ranks" in err and "include[0].mesh" in err, err


def test_a_product_too_large_is_refused_before_expanding(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = ", ".join(str(i) for i in range(100))
    params = ", ".join(f"p{j}: [{values}]" for j in range(4))  # 100^4 = 10^8 combinations
    path = write_matrix(tmp_path, HEAD + "targets:\n"
                        f"  - {{name: a, case: 'tiny:ok', level: unit, params: {{{params}}}}}\n")
    t0 = time.monotonic()
    rc, err = _run_list(path, capsys)
    assert rc == 2, err
    assert "100,000,000 cells" in err and "max_cells (100,000)" in err, err
    assert time.monotonic() - t0 < 30, "refused before expanding, not after"


def test_max_cells_can_be_raised_or_lowered(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = write_matrix(tmp_path, HEAD + "max_cells: 2\ntargets:\n"
                        "  - {name: a, case: 'tiny:ok', level: unit, params: {x: [1, 2, 3]}}\n")
    rc, err = _run_list(path, capsys)
    assert rc == 2 and "3 cells" in err and "max_cells (2)" in err, err


@pytest.mark.parametrize("timeout", ["1e38", "86401", ".inf"])
def test_timeouts_are_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              timeout: str) -> None:
    path = write_matrix(tmp_path, HEAD + "targets:\n"
                        f"  - {{name: a, case: 'tiny:ok', level: unit, timeout: {timeout}}}\n")
    rc, err = _run_list(path, capsys)
    assert rc == 2 and f"{path}:6:" in err and "86400" in err, err
    assert "Traceback" not in err


# ------------------------------------------------------------------------------ gate


def test_duplicate_keys_in_gates_yaml_are_refused(tmp_path: Path) -> None:
    gates = tmp_path / "gates.yaml"
    gates.write_text("version: 1\npolicies:\n  p:\n    allow_flaky: false\n"
                     "    allow_flaky: true\n")
    with pytest.raises(SpecError) as info:
        load_policies(gates)
    assert str(info.value).startswith(f"{gates}:5:") and "duplicate key" in str(info.value)
    gates.write_text("version: 1\npolicies:\n  p: {}\n  p: {allow_flaky: true}\n")
    with pytest.raises(SpecError, match=r":4:.*duplicate key 'p'"):
        load_policies(gates)


def _report(tmp_path: Path, status_prop: str, element: str) -> Path:
    path = tmp_path / "r.xml"
    path.write_text(
        '<testsuites><testsuite name="t"><testcase name="t[unit,1x1,fp64,autocast=off,'
        'reference]@cpu" classname="t"><properties>'
        f'<property name="status" value="{status_prop}"/></properties>{element}'
        "</testcase></testsuite></testsuites>")
    return path


@pytest.mark.parametrize("status_prop", ["passed", "cached", "flaky", "skipped"])
@pytest.mark.parametrize("element", ['<failure message="boom"/>', '<error message="boom"/>'])
def test_a_failure_element_always_wins_over_the_status_property(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], status_prop: str,
        element: str) -> None:
    (cell,) = read_report(_report(tmp_path, status_prop, element))
    assert cell.status is Status.FAILED
    gates = tmp_path / "gates.yaml"
    gates.write_text("version: 1\npolicies:\n  p: {allow_flaky: true, allow_skipped: true}\n")
    assert gate_main("p", tmp_path / "r.xml", None, gates) == 1
    capsys.readouterr()


def test_a_skipped_element_wins_over_a_passed_property(tmp_path: Path) -> None:
    (cell,) = read_report(_report(tmp_path, "passed", '<skipped message="no"/>'))
    assert cell.status is Status.SKIPPED


def test_interrupted_cells_fail_every_gate(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    (cell,) = read_report(_report(tmp_path, "interrupted",
                                  '<skipped message="interrupted: the run was stopped"/>'))
    assert cell.status.value == "interrupted" and not cell.status.ok
    gates = tmp_path / "gates.yaml"
    gates.write_text("version: 1\npolicies:\n  p: {allow_flaky: true, allow_skipped: true}\n")
    assert gate_main("p", tmp_path / "r.xml", None, gates) == 1
    assert "interrupted" in capsys.readouterr().out


# ----------------------------------------------------------------------------- cache


@pytest.mark.parametrize("field", [
    {"stderr_tails": []}, {"failures": [1]}, {"evidence": "x"}, {"failing_ranks": 3},
    {"status": "passed", "duration_s": "soon"}, {"cell_id": 7},
])
def test_cache_entries_of_the_wrong_shape_are_ignored(tmp_path: Path, field: dict) -> None:
    cache = ResultCache(tmp_path)
    digest = "ab" * 32
    cache.put(digest, Result(cell_id="c", status=Status.PASSED), {})
    path = tmp_path / "results" / "ab" / f"{digest}.json"
    data = json.loads(path.read_text())
    data["result"].update(field)
    path.write_text(json.dumps(data))
    assert cache.get(digest, "c") is None


def test_result_from_dict_rejects_wrong_shapes_with_value_error() -> None:
    good = Result(cell_id="c", status=Status.FAILED, kind=FailureKind.ERROR,
                  failures=(RankFailure(rank=1, message="m"),), stderr_tails={1: "t"}).to_dict()
    assert Result.from_dict(good).failures[0].rank == 1
    with pytest.raises(ValueError, match="stderr_tails"):
        Result.from_dict({**good, "stderr_tails": []})


# ------------------------------------------------------------------------------- XML


def test_xml_safe_keeps_text_readable() -> None:
    from cpmatrix.report.junit import xml_safe

    assert xml_safe("\x1b[31mred\x1b[0m plain") == "red plain"
    assert xml_safe("nul \x00 vt \x0b ok\ttab\nline") == "nul \\x00 vt \\x0b ok\ttab\nline"
    assert xml_safe("bad \ud800 surrogate \ufffe") == "bad \\ud800 surrogate \\ufffe"
    assert xml_safe("ünïcödé → ✓") == "ünïcödé → ✓"


def test_a_report_with_control_characters_everywhere_is_written_and_read(
        tmp_path: Path) -> None:
    nasty = "a\x1b[1mb\x1b[0m\x00\x07\x1b"
    r = Result(cell_id="t[unit,1x1,fp64,autocast=off,reference]@cpu", status=Status.FAILED,
               kind=FailureKind.ERROR, failing_ranks=(0,), message=nasty,
               failures=(RankFailure(rank=0, message=nasty, traceback=nasty, check=nasty),),
               stderr_tails={0: nasty}, evidence={nasty: nasty})
    world = tmp_path / "w.junit.xml"
    write_junit(world, results_to_junit([r], {}))
    merge_junit([world], tmp_path / "report.xml")
    (cell,) = read_report(tmp_path / "report.xml")
    assert cell.status is Status.FAILED
    assert "ab\\x00\\x07\\x1b" in cell.text
    assert JUnitXml.fromfile(str(tmp_path / "report.xml"))


# ------------------------------------------------------------------- run identity


def _two_rank_cell() -> tuple[Any, Any]:
    """A 1x2 parity cell on the cpu platform (for the world supervisor's tests)."""
    from cpmatrix.matrix.schema import Cell, Mesh, Platform

    cell = Cell(id="t[unit,1x2,fp64,autocast=off,reference]@cpu", target="t", case="m:f",
                kind="parity", level="unit", mesh=Mesh(1, 2), dtype="fp64", autocast=False,
                path="reference", params=(), platform="cpu", timeout_s=60, tags=())
    return cell, Platform(name="cpu", backend="gloo", device="cpu")


def test_the_supervisor_reads_only_its_own_runs_files(tmp_path: Path) -> None:
    """Two runs on one folder: a marker of the other run is never this run's evidence."""
    from cpmatrix.kinds.world.job import WorldRun
    from cpmatrix.supervise.context import RunContext
    from cpmatrix.supervise.entry import Entry
    from cpmatrix.supervise.runners import get_runner
    from cpmatrix.worker.protocol import Outcome, PidFile, StartMarker, marker_name, write_typed

    cell, platform = _two_rank_cell()

    def world_with_files(run: str) -> WorldRun:
        world = WorldRun("000-w", [Entry(cell=cell)], platform,
                         RunContext(out_root=tmp_path / run, runner=get_runner("local"),
                                    run_id="mine"))
        folder = world.progress.folder
        for rank in (0, 1):
            write_typed(folder / marker_name(0, rank, "start"),
                        StartMarker(index=0, rank=rank, id=cell.id, run=run, time=0.0))
            write_typed(folder / marker_name(0, rank, "done"),
                        Outcome(index=0, rank=rank, id=cell.id, run=run, status="ok",
                                evidence={"x": 1}))
            write_typed(world.folder.pid_file(rank), PidFile(pid=1, rank=rank, run=run))
        world._read_progress()
        world._collect_complete()
        return world

    foreign = world_with_files("other")
    assert foreign.results == [] and foreign._pids == {}, "another run's files were read"
    # The same files written by this run are read (the check above is not vacuous).
    own = world_with_files("mine")
    assert [r.status for _, r in own.results] == [Status.PASSED] and own._pids == {0: 1, 1: 1}


def test_a_world_that_cannot_be_launched_hands_its_cells_back_as_a_failed_start(
        tmp_path: Path) -> None:
    """An OS error launching the world (disk full, no interpreter) is a failed start: the
    session retries it, then fails the cells naming the error. (It used to report the
    cells itself after marking the job finished, and a finished job is never polled.)"""
    from cpmatrix.kinds.world.job import WorldRun
    from cpmatrix.supervise.context import RunContext
    from cpmatrix.supervise.entry import Entry
    from cpmatrix.supervise.runners.base import Launch
    from cpmatrix.supervise.runners.local import LocalRunner

    class DiskFull(LocalRunner):
        def command(self, launch: Launch) -> tuple[list[str], dict[str, str]]:
            raise OSError(28, "No space left on device")

    cell, platform = _two_rank_cell()
    entries = [Entry(cell=cell)]
    world = WorldRun("000-w", entries, platform,
                     RunContext(out_root=tmp_path, runner=DiskFull(), run_id="mine"))
    world.start()
    assert world.finished and world.start_failed
    assert world.start_error == ("could not start the world: OSError: [Errno 28] No space "
                                 "left on device")
    assert world.remaining == entries and world.poll() == []
