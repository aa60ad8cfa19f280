"""The README's front door is true: its "bring your own" example runs as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cli_runner import run_cli

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _block(lang: str, index: int = 0) -> str:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.DOTALL)[index]


def test_the_first_lines_are_the_two_commands() -> None:
    head = README.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split("#")[0].strip() for line in head] == [
        "bash .ci/install && nox -s parity-cpu", "bash .ci/run"]


@pytest.mark.slow
def test_bring_your_own_example_runs_as_written(tmp_path: Path) -> None:
    cp = tmp_path / "tests" / "cp"
    cp.mkdir(parents=True)
    (cp / "cases.py").write_text(_block("python"))
    (cp / "matrix.yaml").write_text(_block("yaml"))
    listed = run_cli("list", "--matrix", str(cp / "matrix.yaml"))
    assert listed.returncode == 0 and len(listed.stdout.split()) == 4, listed.stderr
    proc = run_cli("run", "--matrix", str(cp / "matrix.yaml"), "--out", str(tmp_path / "out"),
                   "--plain", "--no-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(1 planned world, " in proc.stdout
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["status"] for r in results] == ["passed"] * 4
    assert max(r["evidence"]["max_abs_err"] for r in results) < 1e-5
