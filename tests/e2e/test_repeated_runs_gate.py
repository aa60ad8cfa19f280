"""Issue 30's reproducer on a real run: ``--runs-per-test 3`` whose runs end skipped,
failed, failed is FAILED (not SKIPPED), and a gate policy with ``allow_skipped: true``
fails it (exit 1). The test is a pytest target: its first run to arrive skips (an
exclusive create of a marker file), the others fail."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from cli_runner import run_cli
from cpmatrix.report import read_report

pytestmark = pytest.mark.slow

TEST = '''
import os
from pathlib import Path

import pytest


def test_skips_first_then_fails():
    marker = Path(__file__).with_name("first-arrival")
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        raise AssertionError("fails after the first run") from None
    pytest.skip("the first run skips")
'''

MATRIX = '''
version: 1
platforms:
  cpu: {backend: gloo, device: cpu}
targets:
  - name: repro
    pytest: [suite/test_repro.py]
    level: unit
    tags: [release]
    timeout: 60
'''

GATES = '''
version: 1
policies:
  lenient:
    description: skipped and flaky cells allowed
    tags: [release]
    allow_skipped: true
    allow_flaky: true
'''


def test_runs_skipped_failed_failed_are_failed_and_fail_a_lenient_gate(tmp_path: Path,
                                                                      ) -> None:
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "test_repro.py").write_text(textwrap.dedent(TEST))
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    (tmp_path / "gates.yaml").write_text(GATES)
    out = tmp_path / "out"
    run = run_cli("run", "--matrix", str(tmp_path / "matrix.yaml"), "--runs-per-test", "3",
                  "--plain", "--runner", "local", "--out", str(out),
                  "--cache-dir", str(tmp_path / "cache"), timeout=600)
    text = run.stdout + run.stderr
    assert run.returncode == 1, text
    (row,) = json.loads((out / "results.json").read_text())
    assert sorted(row["run_statuses"]) == ["failed", "failed", "skipped"], row
    assert row["status"] == "failed", row
    (case,) = read_report(out / "report.xml")
    assert case.properties["status"] == "failed"
    gate = run_cli("gate", "--policy", "lenient", "--gates", str(tmp_path / "gates.yaml"),
                   "--report", str(out / "report.xml"))
    assert gate.returncode == 1, gate.stdout + gate.stderr
    assert "FAIL" in gate.stdout.upper()
