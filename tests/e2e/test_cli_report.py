"""`cpmatrix gate` and `cpmatrix report` through the real CLI: exit codes and outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_runner import run_cli as cli

RES = Path(__file__).parents[1] / "resources"
REPORTS = RES / "reports"
POLICIES = RES / "gates" / "policies.yaml"


@pytest.mark.parametrize(("report", "code"), [("green.xml", 0), ("failed.xml", 1),
                                              ("flaky.xml", 1), ("truncated.xml", 2)])
def test_gate_exit_codes(report: str, code: int) -> None:
    proc = cli("gate", "--policy", "strict", "--report", str(REPORTS / report),
               "--gates", str(POLICIES))
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_gate_unknown_policy_exits_2() -> None:
    proc = cli("gate", "--policy", "nope", "--report", str(REPORTS / "green.xml"),
               "--gates", str(POLICIES))
    assert proc.returncode == 2 and "nope" in proc.stderr


def test_report_renders_html_and_rejects_a_broken_report(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    proc = cli("report", "--report", str(REPORTS / "green.xml"), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") or page.lower().startswith("<!doctype html>")
    assert "data-status" in page
    proc = cli("report", "--report", str(REPORTS / "not_junit.xml"), "--out", str(out))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
