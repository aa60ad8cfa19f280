"""The line that reruns one cell: ``cpmatrix repro '<id>'``, quoted for a POSIX shell.

Every failure carries it (the terminal's failure block, the JUnit testcase's ``repro``
property, the HTML's failure list, ``cpmatrix show``), so a red cell is one paste away
from its rerun. ``extra`` holds the flags the run had that the repro needs too (the
matrix when the project's ``[tool.cpmatrix]`` does not name it, the runner).

Example::

    >>> print(repro_command("t[unit,2x2,fp64,autocast=off,reference]@cpu", "",
    ...                     ("--matrix", "my matrix.yaml")))
    cpmatrix repro 't[unit,2x2,fp64,autocast=off,reference]@cpu' --matrix 'my matrix.yaml'
    >>> print(repro_command("t@cpu", "no_allreduce", ()))
    cpmatrix repro t@cpu --mutant no_allreduce
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

__all__ = ["repro_command"]


def repro_command(cell_id: str, mutant: str, extra: Sequence[str]) -> str:
    """``cpmatrix repro ID [--mutant M] EXTRA...``, each word quoted where a shell needs it."""
    words = ["cpmatrix", "repro", cell_id, *(["--mutant", mutant] if mutant else []), *extra]
    return shlex.join(words)
