"""``--json`` through the real CLI: for every exit code of ``run``, ``gate``, ``show`` and
``merge`` (0 ok, 1 failures, 2 usage or spec error, 3 nothing selected), stdout is
exactly one JSON document, valid against the schema, whose ``exit_code`` is the exit.

One starter project (``cpmatrix init``), two world starts: a green run and a red one.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from cli_runner import run_cli
from cpmatrix.cli.json_out import SCHEMA_PATH

pytestmark = pytest.mark.slow

SCHEMA = json.loads(SCHEMA_PATH.read_text())
CELL = "allreduce_sum[unit,2x2,fp64,autocast=off,reference]@cpu"
BUG = ("    if cell.world_size == 4 and cell.rank > 0:\n"
       "        mine = mine + 1\n"
       '    cell.record("max_abs_err"')


def _document(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """stdout's one document (json.loads refuses anything before or after it)."""
    doc: dict[str, Any] = json.loads(proc.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["exit_code"] == proc.returncode, (doc, proc.stderr)
    return doc


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("json")
    assert run_cli("init", cwd=root).returncode == 0
    return root


# (name, argv, expected exit); run in order: the green run first, the bug planted before
# "red" (see test_every_exit_gives_one_valid_document).
STEPS: list[tuple[str, tuple[str, ...], int]] = [
    ("run-0", ("run", "--json", "--no-cache"), 0),
    ("gate-0", ("gate", "--json"), 0),
    ("show-0", ("show", CELL, "--json"), 0),
    ("show-history-0", ("show", CELL, "--history", "--json"), 0),
    ("merge-0", ("merge", "out", "--out", "merged", "--json"), 0),
    ("run-3", ("run", "-k", "nosuchthing", "--json", "--out", "out3"), 3),
    ("show-3", ("show", "nosuch[unit", "--json"), 3),
    ("show-history-3", ("show", "nosuch[unit,1x1,fp64,autocast=off,reference]@cpu",
                        "--history", "--json"), 3),
    ("run-2-flag", ("run", "--json", "--bogus"), 2),
    ("run-2-matrix", ("run", "--json", "--matrix", "nosuch.yaml", "--out", "out2"), 2),
    ("run-2-value", ("run", "--json", "--order", "sideways", "--out", "out2"), 2),
    ("gate-2-policy", ("gate", "--json", "--policy", "nosuch"), 2),
    ("gate-2-report", ("gate", "--json", "--report", "nosuch.xml"), 2),
    ("show-2", ("show", "--json"), 2),
    ("merge-2", ("merge", "nosuch", "--out", "merged2", "--json"), 2),
    ("merge-2-same", ("merge", "out", "--out", "out", "--json"), 2),
    ("red", ("run", "--json", "--no-cache", "-k", "2x2", "--out", "red"), 1),
    ("gate-1", ("gate", "--json", "--report", "red/report.xml"), 1),
    ("merge-1", ("merge", "red", "--out", "merged1", "--json"), 1),
]


def test_every_exit_gives_one_valid_document(project: Path) -> None:
    seen: dict[str, dict[str, Any]] = {}
    for name, argv, code in STEPS:
        if name == "red":
            cases = project / "tests" / "cp" / "cases.py"
            cases.write_text(cases.read_text().replace('    cell.record("max_abs_err"', BUG, 1))
        proc = run_cli(*argv, cwd=project)
        assert proc.returncode == code, (name, proc.stdout, proc.stderr)
        seen[name] = _document(proc)
        assert seen[name]["command"] == argv[0], name
    for name in ("run-2-flag", "run-2-matrix", "run-2-value", "gate-2-policy",
                 "gate-2-report", "show-2", "merge-2", "merge-2-same"):
        assert seen[name]["ok"] is False and seen[name]["errors"], name
    assert "--bogus" in seen["run-2-flag"]["errors"][0]
    assert "nosuch.yaml" in seen["run-2-matrix"]["errors"][0]
    assert "nosuch" in seen["gate-2-policy"]["errors"][0]
    assert seen["run-0"]["ok"] and seen["gate-0"]["ok"] and not seen["red"]["ok"]
    assert seen["show-history-0"]["history"]["cell_id"] == CELL
    assert "nosuch" in seen["show-3"]["errors"][0]
    assert seen["run-3"]["cells"] == [] and "nothing selected" in seen["run-3"]["errors"][0]


def test_a_broken_project_table_is_an_error_document(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.cpmatrix]\nmatrixx = "m.yaml"\n')
    for command in ("run", "spill", "gate", "show", "merge"):
        proc = run_cli(command, "--json", cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        doc = _document(proc)
        assert doc["command"] == command.replace("spill", "run"), doc
        assert "matrixx" in doc["errors"][0]
