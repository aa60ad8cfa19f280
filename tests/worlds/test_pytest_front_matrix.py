"""A ``pytest:`` matrix target through the real CLI: list, run, the cache, repro.

The target is ``tests/resources/pytest_front_suites/dialects/test_marker_dialect.py``:
its collected tests are the matrix's cells (a test that needs no ranks in a world of
one), run in cpmatrix's worlds, reported as cells, cached when they pass, and each one
re-runnable alone with ``cpmatrix repro``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli
from pytest_front_runs import SUITES

pytestmark = pytest.mark.slow

MATRIX = """\
version: 1
platforms:
  cpu: {{backend: gloo, device: cpu}}
targets:
  - name: marker
    pytest: {suite}
    timeout: 120
    tags: [front]
"""
FAIL = "marker[unit,1x2,fp64,autocast=off,reference," \
       "test=dialects.test_marker_dialect.py.test_fails_on_rank_zero]@cpu"


def results(out: Path) -> dict[str, dict[str, Any]]:
    data = json.loads((out / "results.json").read_text())
    return {r["cell_id"].split("test=dialects.test_marker_dialect.py.")[1].split("]")[0]: r
            for r in data}


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("matrix")
    path = folder / "m.yaml"
    path.write_text(MATRIX.format(suite=SUITES / "dialects" / "test_marker_dialect.py"))
    return path


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    # Not in the matrix's folder: that folder is on the ranks' sys.path (as for
    # `python -m pytest` run there), so a `cache` folder created in it is a new
    # importable name (a namespace package) and reruns every cell, as it should.
    return {"XDG_CACHE_HOME": str(tmp_path_factory.mktemp("cache-home"))}


@pytest.fixture(scope="module")
def first(matrix: Path, cache_home: dict[str, str],
          tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("first") / "out"
    proc = run_cli("run", "--matrix", str(matrix), "--out", str(out), "--plain",
                   env=cache_home)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout


def test_the_targets_tests_are_its_cells(matrix: Path) -> None:
    proc = run_cli("list", "--matrix", str(matrix), "--json")
    assert proc.returncode == 0, proc.stderr
    cells = json.loads(proc.stdout)
    assert len(cells) == 11
    by_test = {c["params"]["test"]: c for c in cells}
    local = by_test["dialects.test_marker_dialect.py.test_local_no_ranks"]
    assert (local["kind"], local["mesh"], local["world_size"]) == ("pytest", "1x1", 1)
    pair = by_test["dialects.test_marker_dialect.py.test_allreduce"]
    assert pair["mesh"] == "1x2" and "front" in pair["tags"] and "marker" in pair["tags"]
    assert pair["pytest"]["nodeid"] == "dialects/test_marker_dialect.py::test_allreduce"


def test_a_run_reports_each_test_as_a_cell(first: tuple[Path, str]) -> None:
    out, stdout = first
    r = results(out)
    status = {k: v["status"] for k, v in r.items()}
    assert status == {
        "test_allreduce": "passed", "test_sharded_sum-2": "passed",
        "test_sharded_sum-6": "passed", "test_cell_fixture": "passed",
        "test_fails_on_rank_zero": "failed", "test_expected_failure": "passed",
        "test_unexpected_pass": "passed", "test_skipped_by_marker": "skipped",
        "test_skipped_inside": "skipped", "test_record_properties": "passed",
        "test_local_no_ranks": "passed",
    }, stdout[-3000:]
    assert r["test_expected_failure"]["evidence"]["pytest"] == "xfailed"
    assert r["test_unexpected_pass"]["evidence"]["pytest"] == "xpassed"
    assert r["test_skipped_inside"]["message"] == "skipped: decided inside the test, on every rank"
    failure = r["test_fails_on_rank_zero"]
    assert failure["failing_ranks"] == [0]
    assert failure["failures"][0]["check"] == "pytest"
    assert "planted failure on rank 0" in failure["failures"][0]["traceback"]
    report = (out / "report.xml").read_text()
    assert "planted failure on rank 0" in report


def test_passes_are_cached_failures_run_again(matrix: Path, first: tuple[Path, str],
                                              cache_home: dict[str, str],
                                              tmp_path: Path) -> None:
    proc = run_cli("run", "--matrix", str(matrix), "--out", str(tmp_path / "out"), "--plain",
                   env=cache_home)
    assert proc.returncode == 1, proc.stdout[-3000:]
    status = {k: v["status"] for k, v in results(tmp_path / "out").items()}
    assert status["test_allreduce"] == "cached"
    assert status["test_fails_on_rank_zero"] == "failed"
    assert status["test_skipped_inside"] == "skipped"  # only passes are stored


def test_repro_runs_one_test_again(matrix: Path, tmp_path: Path) -> None:
    proc = run_cli("repro", FAIL, "--matrix", str(matrix), "--out", str(tmp_path / "out"))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "[rank0]" in proc.stdout and "planted failure on rank 0" in proc.stdout
    assert list(results(tmp_path / "out")) == ["test_fails_on_rank_zero"]
