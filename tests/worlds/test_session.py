"""``run_cells`` with cells it must not run: skipped ones share the report with real ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpmatrix.kinds.executors import EXECUTORS
from cpmatrix.matrix.expand import expand
from cpmatrix.matrix.load import load_matrix
from cpmatrix.plan.plan import Placement, make_plan
from cpmatrix.report import read_report
from cpmatrix.supervise.options import RunOptions
from cpmatrix.supervise.runners import get_runner
from cpmatrix.supervise.session import Watch, run_cells
from cpmatrix.supervise.setup import devices_for, make_context

RES = Path(__file__).parents[1] / "resources"


@pytest.mark.slow
def test_skipped_cells_are_reported_beside_the_cells_that_ran(tmp_path: Path) -> None:
    matrix = load_matrix(RES / "runtime.yaml")
    cells = expand(matrix).cells
    run = [c for c in cells if c.platform == "cpu" and c.world_size == 1]
    wide = [c for c in cells if c.platform == "cuda" and c.world_size > 1]
    platforms = {p.name: p for p in matrix.platforms}
    _, _, skipped, _ = devices_for(wide, platforms, RunOptions(gpus=1), executors=EXECUTORS)
    assert len(run) == 1 and len(skipped) == 3
    out = tmp_path / "out"
    options = make_context(matrix, out, get_runner("local"), RunOptions(), run_id="test-skip")
    seen: list[str] = []
    plan = make_plan(EXECUTORS, Placement(cells=tuple(run), skipped=tuple(skipped)))
    report = run_cells(plan, {p.name: p for p in matrix.platforms}, options,
                       watch=Watch(on_result=lambda entry, result: seen.append(entry.key)))
    # One world for the cell that ran, none for the skipped ones; progress hears of the
    # cell that ran only.
    assert report.world_starts == 1
    assert seen == [run[0].id]
    assert {k: r.status.value for k, r in report.results.items()} == {
        run[0].id: "passed", **{c.id: "skipped" for c, _ in skipped}}
    cases = {c.name: c for c in read_report(out / "report.xml")}
    assert cases[run[0].id].properties["status"] == "passed"
    for c, why in skipped:
        props = cases[c.id].properties
        assert props["status"] == "skipped" and props["world_size"] == str(c.world_size)
        assert props["message"] == f"not run: {why}"
    results = json.loads((out / "results.json").read_text())
    assert sorted(r["status"] for r in results) == ["passed", "skipped", "skipped", "skipped"]
    # A skipped cell never enters the durations the planner learns from.
    assert set(json.loads((out / "durations.json").read_text())) == {run[0].id}
