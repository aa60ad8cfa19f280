"""Where a run's results come from: the source identity every results file records.

A run's **source** is what its verdicts were computed from:

- per cell, the **source digest** (:meth:`cpmatrix.cache.key.ActionKeys.source_digest`):
  the cell digest (spec, case module, platform), the sources of the project-local modules
  the case imports, and cpmatrix's world-side source;
- per run, the **matrix digest** (sha256 of the matrix file), cpmatrix's **version**, the
  **runtime** digest (cpmatrix's world-side source) and the **git commit** of the
  matrix's folder when it is in a git work tree (``+dirty`` when tracked files differ
  from it).

``run.json`` holds the run's source and every selected cell's digest (for a shard, those
of the whole selection, so ``cpmatrix merge`` can tell shards of different sources
apart even though they share no cell); each result carries its own (``Result.source``:
``results.json`` rows, ``source.*`` properties on each testcase of ``report.xml``).
``cpmatrix merge`` refuses folders whose digests of a cell differ; ``cpmatrix gate``
fails a cell whose digest is not the one its matrix gives now (``stale``).

Example::

    >>> src = RunSource(matrix="ab" * 32, cpmatrix="0.1.0", runtime="cd" * 32, commit="")
    >>> sorted(src.for_cell("ef" * 32))
    ['commit', 'cpmatrix', 'digest', 'matrix', 'runtime']
    >>> RunSource.from_dict(src.to_dict()) == src
    True
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cpmatrix import __version__
from cpmatrix.cache.key import ActionKeys
from cpmatrix.matrix.schema import Cell

if TYPE_CHECKING:
    from cpmatrix.matrix.expand import Collect

__all__ = [
    "RunSource",
    "cell_digests",
    "expanded_digests",
    "git_commit",
    "matrix_digest",
    "matrix_digests",
    "run_source",
    "stamp",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSource:
    """The run-level half of a results file's source identity."""

    #: sha256 of the matrix file's bytes.
    matrix: str
    #: cpmatrix's version.
    cpmatrix: str
    #: cpmatrix's world-side source (``ActionKeys.runtime_digest``).
    runtime: str
    #: The git commit of the matrix's folder (``+dirty`` with local changes), or "".
    commit: str

    def for_cell(self, digest: str) -> dict[str, str]:
        """A result's ``source``: the cell's digest and this run's identity."""
        return {"digest": digest, **self.to_dict()}

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> RunSource:
        """``ValueError`` for anything but a mapping holding the four strings."""
        if not isinstance(data, dict):
            raise ValueError("a run source must be a mapping")
        try:
            values = {k: data[k] for k in ("matrix", "cpmatrix", "runtime", "commit")}
        except KeyError as exc:
            raise ValueError(f"a run source lacks {exc}") from None
        if not all(isinstance(v, str) for v in values.values()):
            raise ValueError("a run source holds strings")
        return cls(**values)


def matrix_digest(path: str | os.PathLike[str], made: object | None = None) -> str:
    """sha256 of a matrix file's bytes; for a matrix made in code (``made``, the pytest
    front's: its path names no file), of its description instead."""
    if made is not None and not Path(path).is_file():
        return hashlib.sha256(b"made in code\0" + repr(made).encode()).hexdigest()
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def git_commit(folder: str | os.PathLike[str]) -> str:
    """The commit checked out in the git work tree holding ``folder`` (``+dirty`` when a
    tracked file differs from it); "" outside a work tree or without git."""

    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", "-C", os.fspath(folder), *args], capture_output=True,
                                  text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    head = git("rev-parse", "--verify", "-q", "HEAD")
    if not head:
        return ""
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return head + ("+dirty" if dirty else "")


def run_source(matrix_path: str | os.PathLike[str], keys: ActionKeys,
               made: object | None = None) -> RunSource:
    """This run's source identity (reads the matrix file, asks git); ``made``: the matrix
    itself, for one made in code rather than read from ``matrix_path``."""
    return RunSource(matrix=matrix_digest(matrix_path, made), cpmatrix=__version__,
                     runtime=keys.runtime_digest,
                     commit=git_commit(Path(matrix_path).resolve().parent))


def cell_digests(cells: Iterable[Cell], keys: ActionKeys) -> dict[str, str]:
    """Cell id -> source digest."""
    return {c.id: keys.source_digest(c) for c in cells}


def matrix_digests(path: str | os.PathLike[str], *, collect: Collect | None = None,
                   ) -> dict[str, str]:
    """Cell id -> source digest of every cell of the matrix file at ``path``, from the
    sources as they are now (what ``cpmatrix gate`` checks a report against);
    ``collect``: the pytest kind's collector, for a ``pytest:`` target's cells.

    Raises :class:`~cpmatrix.errors.SpecError` for a matrix that does not load.
    """
    return expanded_digests(path, collect=collect)[1]


def expanded_digests(path: str | os.PathLike[str], *, collect: Collect | None = None,
                     ) -> tuple[tuple[Cell, ...], dict[str, str]]:
    """The cells of the matrix file at ``path`` and :func:`matrix_digests`'s digests, from
    one expansion (a ``pytest:`` target's collection, by ``collect``, is a subprocess:
    run it once)."""
    from cpmatrix.matrix.expand import expand
    from cpmatrix.matrix.load import load_matrix

    matrix = load_matrix(path)
    cells = expand(matrix, collect=collect).cells
    return cells, cell_digests(cells, ActionKeys(search_path=matrix.pythonpath))


def stamp(sources: Mapping[str, str], source: RunSource) -> dict[str, dict[str, str]]:
    """Cell id -> the ``source`` its results carry."""
    return {cell_id: source.for_cell(digest) for cell_id, digest in sources.items()}
