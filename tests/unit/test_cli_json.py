"""``--json`` documents (cpmatrix.cli.json_out) against their JSON Schema, and the
schema against documents it must refuse (a schema that accepts anything proves nothing);
the static case check (cpmatrix.matrix.case_check); the HTML's timings and history."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from cpmatrix.cli.json_out import (
    SCHEMA_PATH,
    error_doc,
    gate_doc,
    merge_doc,
    run_doc,
    show_doc,
)
from cpmatrix.gate import evaluate
from cpmatrix.gate._policy import Policy
from cpmatrix.matrix.case_check import module_names
from cpmatrix.report.history import CellHistory, RunRecord
from cpmatrix.report.html_timing import history_section, target_runs, timings_section
from cpmatrix.report.merge import MergeSummary
from cpmatrix.report.read import ReportCell
from cpmatrix.result import FailureKind, RankFailure, Result, Status
from cpmatrix.supervise.run_report import RunReport

SCHEMA = json.loads(SCHEMA_PATH.read_text())
FAILED = Result(cell_id="t[unit,2x2,fp64,autocast=off,reference]@cpu", status=Status.FAILED,
                kind=FailureKind.ERROR, failing_ranks=(1, 2),
                failures=(RankFailure(rank=1, message="AssertionError: x"),),
                evidence={"err@rank1": 1.0, "err@rank0": 0.0}, duration_s=0.4,
                repro="cpmatrix repro 't[unit,2x2,fp64,autocast=off,reference]@cpu'")
PASSED = Result(cell_id="t[unit,1x2,fp64,autocast=off,reference]@cpu", status=Status.PASSED)


def docs(tmp_path: Path) -> dict[str, dict[str, Any]]:
    report = RunReport(results={FAILED.cell_id: FAILED, PASSED.cell_id: PASSED}, wall_s=2.0,
                       report_path=tmp_path / "report.xml")
    gate = evaluate(Policy(name="release"), [ReportCell(name=PASSED.cell_id,
                                                        status=Status.PASSED, properties={})])
    return {
        "run": run_doc(1, report, tmp_path, ["a warning"]),
        "run-nothing": run_doc(3, None, tmp_path, ["nothing selected"]),
        "run-usage": error_doc("run", 2, "no matrix"),
        "gate": gate_doc(0, gate, []),
        "gate-usage": error_doc("gate", 2, "no policy 'x'"),
        "show": show_doc(0, {"id": FAILED.cell_id}, FAILED, tmp_path / "results.json", []),
        "show-none": show_doc(0, {"id": PASSED.cell_id}, None, None, ["no result"]),
        "show-history": show_doc(0, None, None, None, [], history={
            "cell_id": "c", "duration_s": None, "passed": 0, "failed": 1, "flipped": False,
            "flake_rate": 0.0, "runs": [{"at": 1.0, "outcome": "failed", "duration_s": 2.0}]}),
        "show-nothing": show_doc(3, None, None, None, ["no cell 'x'"]),
        "merge": merge_doc(1, tmp_path, [tmp_path / "a"], MergeSummary(
            cells=2, missing=("m",), duplicates=(), warnings=()), 1, []),
    }


def test_every_document_validates_against_the_schema(tmp_path: Path) -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    for name, doc in docs(tmp_path).items():
        jsonschema.validate(json.loads(json.dumps(doc, default=str)), SCHEMA), name
    run = docs(tmp_path)["run"]
    cell = next(c for c in run["cells"] if c["status"] == "failed")
    assert cell["repro"] == FAILED.repro and cell["failing_ranks"] == [1, 2]
    assert run["targets"] == [{"target": "t", "cells": 2, "passed": 1, "failed": 1,
                               "skipped": 0, "time_s": 0.4}]


@pytest.mark.parametrize(("name", "break_it"), [
    ("run", lambda d: d.pop("exit_code")),
    ("run", lambda d: d["cells"][0].pop("repro")),
    ("run", lambda d: d["cells"][0].update(status="green")),
    ("run", lambda d: d.update(extra=1)),
    ("gate", lambda d: d["reasons"].append({"check": "x"})),
    ("show", lambda d: d.update(command="run")),
    ("merge", lambda d: d.update(schema_version=2)),
    ("run", lambda d: d.pop("cells")),
    ("gate", lambda d: d["mutants"].update(extra=1)),
    ("show", lambda d: d.pop("history")),
    ("run-usage", lambda d: d.update(exit_code=0)),
    ("run-usage", lambda d: d.update(errors=[])),
    ("run-usage", lambda d: d.update(out="x")),
    ("gate-usage", lambda d: d.update(ok=True)),
], ids=["no-exit-code", "no-repro", "bad-status", "extra-key", "bad-reason", "wrong-command",
        "version", "run-without-cells", "mutants-extra", "show-without-history",
        "error-exit-0", "error-without-why", "error-with-run-fields", "error-ok"])
def test_the_schema_refuses_a_broken_document(tmp_path: Path, name: str,
                                              break_it: Any) -> None:
    doc = copy.deepcopy(json.loads(json.dumps(docs(tmp_path)[name], default=str)))
    break_it(doc)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA)


@pytest.mark.parametrize(("source", "names", "dynamic"), [
    ("def f(): pass\nclass C: pass\nx = 1\n", {"f", "C", "x"}, False),
    ("import a.b\nfrom c import d as e\n", {"a", "e"}, False),
    ("try:\n    from fast import f\nexcept ImportError:\n    def f(): pass\n", {"f"}, False),
    ("if True:\n    g = lambda cell: None\n", {"g"}, False),
    ("from torch import *\n", set(), True),
    ("def __getattr__(name): ...\n", {"__getattr__"}, True),
    ("globals()['h'] = print\n", set(), True),
    ("for n in ('a', 'b'):\n    pass\n", {"n"}, False),
], ids=["defs", "imports", "try", "if", "star", "getattr", "globals", "for"])
def test_module_names_are_read_statically(source: str, names: set[str],
                                          dynamic: bool) -> None:
    found, dyn = module_names(source)
    assert names <= found and dyn is dynamic


def test_the_html_times_each_world_and_plots_each_targets_history() -> None:
    cells = [ReportCell(name="t[a]@cpu", status=Status.PASSED,
                        properties={"duration": "2.5", "case_time": "0.1"}, time=2.5)]
    jobs = [{"name": "000-cpu-w4-b0.a1", "what": "a world", "cells": 1, "started_s": 0.5,
             "first_result_s": 4.5, "ended_s": 5.0}]
    page = timings_section(cells, jobs)
    assert "<code>000-cpu-w4-b0.a1</code>" in page and "4.00 s" in page and "4.50 s" in page
    assert "2.500 s" in page
    history = {"t[a]@cpu": CellHistory(runs=(RunRecord(10.0, "passed", 1.0),
                                            RunRecord(20.0, "failed", 3.0))),
               "t[b]@cpu": CellHistory(runs=(RunRecord(10.0, "passed", 1.0),
                                            RunRecord(20.0, "passed", 1.0)))}
    runs = target_runs(history)["t"]
    assert [(r.cells, r.failed, r.seconds) for r in runs] == [(2, 0, 2.0), (2, 1, 4.0)]
    section = history_section(history)
    assert section.count("<svg") == 1 and section.count("<rect") == 2
    assert 'data-failed="1"' in section and "50% of its cells flipped" in section
    assert "http" not in section.replace("http://www.w3.org/2000/svg", "")
