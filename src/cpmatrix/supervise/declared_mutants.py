"""The mutants each cell's case declares, read in a child process of ``--python``.

Example::

    >>> discover_mutants((), [], sys.executable, executors=())
    {}
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence

from cpmatrix.errors import UsageError
from cpmatrix.matrix.schema import Cell
from cpmatrix.module_names import DISCOVER_MAIN
from cpmatrix.paths import IMPORT_ROOT
from cpmatrix.supervise.executors.base import Executor, executor_for

__all__ = ["discover_mutants"]


def discover_mutants(pythonpath: Sequence[str], cells: Sequence[Cell],
                     python: str = sys.executable, *, executors: Sequence[Executor],
                     ) -> dict[str, list[str]]:
    """Cell id -> ``["", *mutants]`` (the unmutated run first: a mutant is only "killed"
    against a green cell). Cells whose executor (among ``executors``) runs no mutants
    get ``[""]``.

    Raises :class:`UsageError` when a case cannot be imported: never "0/0 killed".
    """
    cases = sorted({c.case for c in cells if executor_for(executors, c.kind).supports_mutants})
    if not cases:
        return {c.id: [""] for c in cells}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((*pythonpath, str(IMPORT_ROOT)))}
    proc = subprocess.run(
        [python, "-m", DISCOVER_MAIN, json.dumps(list(pythonpath)),
         json.dumps(cases)], capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise UsageError(f"could not read declared mutants:\n{proc.stderr[-2000:]}")
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    per_cell: dict[str, list[str]] = {}
    for c in cells:
        declared = found.get(c.case, []) if executor_for(executors, c.kind).supports_mutants \
            else []
        if isinstance(declared, dict):
            raise UsageError(f"--mutants: cannot import {c.case}: {declared['error']}")
        per_cell[c.id] = ["", *declared]
    return per_cell
