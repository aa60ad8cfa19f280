"""An entry: one cell to run once (optionally with a mutant), and where its files go.

Example::

    >>> cell_folder("t[unit,1x1,fp64,autocast=off,reference]@cpu")
    't[unit,1x1,fp64,autocast=off,reference]@cpu'
    >>> len(cell_folder("t" * 300)), cell_folder("t" * 300)[-17:-16]
    (113, '~')
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from cpmatrix.layout import cell_dir
from cpmatrix.matrix.schema import Cell
from cpmatrix.result import testcase_name

__all__ = ["RUN_MARK", "Entry", "cell_folder"]

#: Separates a cell's testcase name from its run number in an entry key (internal: the
#: report combines a cell's runs into one testcase).
RUN_MARK = "#run="

#: File names may hold 255 bytes; an id longer than this gets a digest-based name.
_MAX_FOLDER_BYTES = 160


def cell_folder(name: str) -> str:
    """A file name for a cell id: the id itself, or a prefix and a digest when too long."""
    if len(name.encode()) <= _MAX_FOLDER_BYTES:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{name.encode()[:96].decode(errors='ignore')}~{digest}"


@dataclass(frozen=True, slots=True)
class Entry:
    """One cell to run (optionally with a mutant switched on), and which attempt this is.

    Why a shape apart from the ``Cell`` it wraps (copying none of its fields): one cell
    runs several times in a session (each mutant, a crash's retry, each of ``--runs-per-test``
    N runs), and each run needs its own key and folder; the cell stays the
    content-addressed unit its digest and cache key are of.
    """

    cell: Cell
    mutant: str = ""
    attempt: int = 1
    #: ``--runs-per-test N`` (N > 1): which run of the cell this is, 1..N; 0 for a cell's
    #: only run (its key and folder are then a plain run's).
    run: int = 0

    @property
    def key(self) -> str:
        """Unique within a run: the testcase name, and ``#run=K`` for one of N runs (the
        report holds one testcase per cell, its runs combined)."""
        name = testcase_name(self.cell.id, self.mutant)
        return f"{name}{RUN_MARK}{self.run}" if self.run else name

    @property
    def out_dir(self) -> str:
        """The cell's folder, relative to the run's output folder (``run-K`` below it for
        one of N runs)."""
        base = cell_dir(cell_folder(self.cell.id))
        if self.mutant:
            base = f"{base}/mutant-{cell_folder(self.mutant)}"
        return f"{base}/run-{self.run}" if self.run else base
