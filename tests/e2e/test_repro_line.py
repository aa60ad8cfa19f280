"""The repro line works where it is pasted: from any folder when the run named its matrix
with ``--matrix`` (the line holds the absolute path), from a subfolder of the project
when the project's table names it (``tests/e2e/test_newcomer.py`` pastes that one)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from cli_runner import run_cli

pytestmark = pytest.mark.slow

CELL = "allreduce_sum[unit,2x2,fp64,autocast=off,reference]@cpu"
#: Ranks 1-3 of a 2x2 mesh add 1 to their reduced shard.
BUG = ("    if cell.world_size == 4 and cell.rank > 0:\n"
       "        mine = mine + 1\n"
       '    cell.record("max_abs_err"')


def test_a_line_made_with_a_relative_matrix_works_from_another_folder(tmp_path: Path) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    assert run_cli("init", cwd=project).returncode == 0
    (project / "pyproject.toml").unlink()  # no table: the run names its matrix itself
    cases = project / "tests" / "cp" / "cases.py"
    cases.write_text(cases.read_text().replace('    cell.record("max_abs_err"', BUG, 1))
    red = run_cli("run", "--matrix", "tests/cp/matrix.yaml", "-k", "2x2 and fp64",
                  "--plain", "--no-cache", cwd=project)
    assert red.returncode == 1, red.stdout + red.stderr
    line = next(ln.split("repro: ", 1)[1] for ln in red.stdout.splitlines()
                if ln.strip().startswith("repro: "))
    words = shlex.split(line)
    matrix = str(project / "tests" / "cp" / "matrix.yaml")
    assert words == ["cpmatrix", "repro", CELL, "--matrix", matrix], line
    pasted = run_cli(*words[1:], cwd=elsewhere)
    assert pasted.returncode == 1, pasted.stdout + pasted.stderr
    assert "ranks 1-3: AssertionError" in pasted.stdout
