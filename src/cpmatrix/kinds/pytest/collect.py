"""A ``pytest:`` matrix target's cells: its tests, collected by pytest in a subprocess.

Collecting imports the test modules (torch and its test harness, the project's code), so
it runs in a child process (:mod:`cpmatrix.kinds.pytest.collect_main`), in the matrix
file's folder, with the matrix's ``pythonpath``. Every test collected becomes one cell
per world it asks for (:func:`cpmatrix.kinds.pytest.spec.cells_for`), on each platform
of the target; a test that needs no ranks gets a world of one. A collection that fails,
or finds nothing, is a spec error at the target's ``pytest:`` line, with pytest's own
output.

Example::

    >>> from cpmatrix.matrix.schema import Matrix
    >>> callable(collect_target)
    True
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from cpmatrix.errors import SpecError
from cpmatrix.kinds.pytest.spec import PytestSession, PytestTest, cells_for
from cpmatrix.matrix.schema import Cell, Matrix, Mesh, Target
from cpmatrix.module_names import PYTEST_COLLECTOR
from cpmatrix.paths import IMPORT_ROOT

__all__ = ["collect_target"]

#: Longest a collection may take (it imports torch and every test module).
COLLECT_TIMEOUT_S = 900


def _error(matrix: Matrix, target: Target, index: int, message: str) -> SpecError:
    file = target.where.rpartition(":")[0] or matrix.path
    line, column = target.case_at
    return SpecError(file, line, column, f"targets[{index}].pytest", message,
                     "files, folders or node ids whose tests pytest collects")


def collect_target(matrix: Matrix, target: Target, index: int, *,
                   python: str = sys.executable) -> list[Cell]:
    """The cells of ``target`` (``kind: pytest``), on each of its platforms."""
    base = os.path.dirname(os.path.abspath(matrix.path))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(
        [*matrix.pythonpath, str(IMPORT_ROOT),
         *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]))
    with tempfile.TemporaryDirectory(prefix="cpmatrix-collect-") as tmp:
        out = Path(tmp, "tests.json")
        try:
            proc = subprocess.run(
                [python, "-m", PYTEST_COLLECTOR, str(out), "--",
                 *target.pytest], cwd=base, env=env, capture_output=True, text=True,
                timeout=COLLECT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise _error(matrix, target, index, f"collecting {target.name!r} took longer "
                         f"than {COLLECT_TIMEOUT_S} s") from None
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        if proc.returncode == 5:
            raise _error(matrix, target, index, f"no tests collected for {target.name!r}")
        if proc.returncode != 0 or not out.exists():
            raise _error(matrix, target, index, f"collecting the tests of {target.name!r} "
                         f"failed (pytest exit code {proc.returncode}):\n{tail}")
        data = json.loads(out.read_text(encoding="utf-8"))
    session = PytestSession.from_json(data["session"])
    tests = [PytestTest.from_dict(t) for t in data["tests"]]
    names = target.platforms or tuple(p.name for p in matrix.platforms)
    cells: list[Cell] = []
    for name in names:
        platform = matrix.platform(name)
        for t in tests:
            wide = [m for m in t.meshes if Mesh.parse(m).world_size > platform.max_ranks]
            if wide:
                raise _error(matrix, target, index, f"{t.nodeid} asks for a world of "
                             f"{wide[0]} on platform {name!r}, more than its max_ranks "
                             f"({platform.max_ranks})")
        cells += cells_for(tests, session, platform=platform, target=target.name,
                           level=target.level, timeout_s=target.timeout_s, tags=target.tags)
    return cells
