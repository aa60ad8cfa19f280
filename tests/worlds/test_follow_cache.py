"""Issue 30, row 1: a cached PASS covers the processes a cell starts, or the cell is not
cached, with the reason in the report. Real CLI, real gloo worlds, real subprocesses.

``resources/follow_project``: ``native_cat`` runs ``cat data/values.txt`` (a native
program: its own reads are invisible, so the cell is never stored); ``python_helper``
runs ``reference.py``, a Python helper that reads ``data/reference.txt`` itself (it is
followed: both files join the cell's observed set). Runs: store, reuse, then the helper's
data edited, then the helper itself edited (the data put back): each edit reruns it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from cli_runner import RES, run_cli

pytestmark = pytest.mark.slow


class Project:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root / "project"
        self.cache = root / "cache"
        self.runs: list[dict[str, dict[str, Any]]] = []
        self.logs: list[str] = []

    def run(self) -> dict[str, dict[str, Any]]:
        out = self.root / f"out{len(self.runs)}"
        proc = run_cli("run", "--matrix", str(self.dir / "matrix.yaml"), "--out", str(out),
                       "--cache-dir", str(self.cache), "--plain", timeout=600)
        assert proc.returncode in (0, 1), proc.stdout + proc.stderr
        results = {r["cell_id"].split("[", 1)[0]: r
                   for r in json.loads((out / "results.json").read_text())}
        self.runs.append(results)
        self.logs.append(proc.stdout + proc.stderr)
        return results

    def stored(self) -> set[str]:
        return {json.loads(p.read_text())["result"]["cell_id"].split("[", 1)[0]
                for p in self.cache.glob("results/*/*.json")}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    p = Project(tmp_path_factory.mktemp("follow"))
    shutil.copytree(RES / "follow_project", p.dir)
    p.run()
    p.first_stored = p.stored()  # type: ignore[attr-defined]
    p.run()
    data = p.dir / "data" / "reference.txt"
    data.write_text("3.0\n")
    p.run()
    data.write_text("2.0\n")
    helper = p.dir / "reference.py"
    helper.write_text(helper.read_text().replace("SCALE = 1.0", "SCALE = 1.5"))
    p.run()
    return p


def test_a_native_child_makes_the_cell_uncached_with_the_reason(project: Project) -> None:
    first, second = project.runs[0], project.runs[1]
    assert first["native_cat"]["status"] == "passed", first["native_cat"]
    why = first["native_cat"]["evidence"]["not_cached"]
    assert why.startswith("it started `cat ") and "values.txt`" in why, why
    assert "native_cat" not in project.first_stored  # type: ignore[attr-defined]
    assert "is not cached: it started `cat " in project.logs[0]
    assert second["native_cat"]["status"] == "passed"  # it ran again


def test_a_followed_python_helper_is_cached(project: Project) -> None:
    first, second = project.runs[0], project.runs[1]
    assert first["python_helper"]["status"] == "passed", first["python_helper"]
    assert "not_cached" not in first["python_helper"]["evidence"]
    assert "python_helper" in project.first_stored  # type: ignore[attr-defined]
    assert second["python_helper"]["status"] == "cached"


def test_a_change_of_the_helpers_data_reruns_the_cell(project: Project) -> None:
    third = project.runs[2]["python_helper"]
    assert third["status"] == "failed", third["status"]
    assert "printed 3.0" in third["failures"][0]["message"]


def test_a_change_of_the_helper_itself_reruns_the_cell(project: Project) -> None:
    fourth = project.runs[3]["python_helper"]
    assert fourth["status"] == "failed", fourth["status"]
    assert "printed 3.0" in fourth["failures"][0]["message"]  # 2.0 * 1.5
