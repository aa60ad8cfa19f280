"""Where the protocol's files live: a job's folder, its progress markers, a cell's files.

Both sides build every path here, never by hand: the supervisor
(:mod:`cpmatrix.kinds.world.job`, :mod:`~cpmatrix.kinds.compile.executor`) and the
children (:mod:`cpmatrix.worker.world_main`, :mod:`~cpmatrix.worker.forkrun`,
:mod:`~cpmatrix.worker.compile_main`). Standard library only.

A world's folder (:class:`WorldFolder`, ``<out>/worlds/<world>``)::

    world.json          the job file (WorldSpec), written by the supervisor
    command.json        the launcher's command and environment (for ``repro``)
    torchrun.log        the launcher's own output (either launcher)
    root_cause.json     the fork launcher's first failing rank (RootCause)
    rank<R>.pid         each rank's PidFile; rank<R>.left once it exits normally
    rank<R>.log         each rank's stdout and stderr
    rank<R>.idle-stacks.txt   its stacks when dumped between cells
    dump.request        touched by the supervisor: every rank dumps its stacks
    progress/<i>.r<r>.start|done   per cell and rank in the cell: StartMarker, Outcome
    strays/<i>.r<r>.<pid>          a case's forked child that came back into cpmatrix
    home/, tmp/         the launcher's HOME and TMPDIR
    pytest-tmp/rank<R>/ each rank's pytest basetemp (the pytest front)

A compile job's folder (:class:`CompileFolder`, ``<out>/spill/<job>``): ``job.json``,
``spill.log`` and ``progress/`` (rank 0 only). A cell's files, relative to the run's
output folder, are :mod:`cpmatrix.layout`'s (``rank_dir``, ``cell_output_log``,
``cell_stacks``, ``work_folder``).

Example::

    >>> folder = WorldFolder(Path("/o/worlds/w"))
    >>> folder.pid_file(2).name, folder.marker(3, 1, DONE).relative_to(folder.path)
    ('rank2.pid', PosixPath('progress/3.r1.done'))
    >>> marker_name(3, 1, "done"), parse_marker_name("3.r1.done")
    ('3.r1.done', (3, 1, 'done'))
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

__all__ = [
    "DONE",
    "START",
    "CompileFolder",
    "MarkerKind",
    "WorldFolder",
    "marker_name",
    "parse_marker_name",
]

MarkerKind = Literal["start", "done"]
#: The start marker (written before a cell runs) and the done marker (its outcome).
START: Final = "start"
DONE: Final = "done"
_PROGRESS: Final = "progress"


def marker_name(index: int, rank: int, kind: MarkerKind) -> str:
    """The name of cell ``index``'s ``kind`` marker on ``rank`` (its rank in the cell)."""
    return f"{index}.r{rank}.{kind}"


def parse_marker_name(name: str) -> tuple[int, int, MarkerKind] | None:
    """``(index, rank, kind)`` of a marker file name; None for any other file."""
    stem, _, kind = name.rpartition(".")
    index, sep, rank = stem.partition(".r")
    if kind not in (START, DONE) or not sep or not index.isdigit() or not rank.isdigit():
        return None
    return int(index), int(rank), kind  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class _JobFolder:
    """A job's folder and the markers its cells leave in ``progress/``."""

    path: Path

    @property
    def progress(self) -> Path:
        """The folder of the cells' markers (:func:`marker_name`)."""
        return self.path / _PROGRESS

    def marker(self, index: int, rank: int, kind: MarkerKind) -> Path:
        """Cell ``index``'s ``kind`` marker on ``rank`` (its rank in the cell)."""
        return self.progress / marker_name(index, rank, kind)


@dataclass(frozen=True, slots=True)
class WorldFolder(_JobFolder):
    """A world launch's folder: every file the supervisor and the ranks exchange.

    Made afresh (emptied) by the supervisor for every launch, so no file of an
    earlier launch is ever read as this one's.
    """

    @property
    def world_file(self) -> Path:
        """The job file (:class:`~cpmatrix.worker.protocol.records.WorldSpec`)."""
        return self.path / "world.json"

    @property
    def command_file(self) -> Path:
        """The launcher's argv and environment, as ``{"argv": [...], "env": {...}}``."""
        return self.path / "command.json"

    @property
    def launcher_log(self) -> Path:
        """The launcher's stdout and stderr (torchrun's "Root Cause" block is there)."""
        return self.path / "torchrun.log"

    @property
    def root_cause(self) -> Path:
        """The fork launcher's :class:`~cpmatrix.worker.protocol.records.RootCause`."""
        return self.path / "root_cause.json"

    @property
    def dump_request(self) -> Path:
        """Its modification time changing asks every rank for its stacks (a rank in its
        own pid namespace cannot be signalled)."""
        return self.path / "dump.request"

    def pid_file(self, rank: int) -> Path:
        """World rank ``rank``'s :class:`~cpmatrix.worker.protocol.records.PidFile`."""
        return self.path / f"rank{rank}.pid"

    def left_file(self, rank: int) -> Path:
        """World rank ``rank``'s :class:`~cpmatrix.worker.protocol.records.RankLeft`."""
        return self.path / f"rank{rank}.left"

    def rank_log(self, rank: int) -> Path:
        """World rank ``rank``'s stdout and stderr (its cells' markers hold offsets)."""
        return self.path / f"rank{rank}.log"

    def rank_logs(self) -> list[Path]:
        """The ranks' logs there now, by name (what ``repro`` follows, with the
        launcher's)."""
        return sorted(p for p in self.path.glob("rank*.log")
                      if p.stem.removeprefix("rank").isdigit())

    def pytest_tmp(self, rank: int) -> Path:
        """World rank ``rank``'s pytest ``basetemp`` (the pytest front): ranks never clean
        up each other's ``tmp_path`` folders."""
        return self.path / "pytest-tmp" / f"rank{rank}"

    def idle_stacks(self, rank: int) -> Path:
        """Where world rank ``rank`` dumps its stacks while it waits between cells."""
        return self.path / f"rank{rank}.idle-stacks.txt"

    @property
    def home(self) -> Path:
        """The launcher's ``HOME`` (a cell gets its own: :func:`cpmatrix.layout.work_folder`)."""
        return self.path / "home"

    @property
    def tmp(self) -> Path:
        """The launcher's ``TMPDIR``."""
        return self.path / "tmp"

    @property
    def strays(self) -> Path:
        """Notes of a case's forked children that came back out of the case."""
        return self.path / "strays"

    def stray(self, index: int, rank: int, pid: int) -> Path:
        """The note of child ``pid`` of cell ``index`` on ``rank`` (its rank in the cell)."""
        return self.strays / f"{self._stray_prefix(index, rank)}{pid}"

    def strays_of(self, index: int, rank: int) -> dict[str, Path]:
        """Every note :meth:`stray` left for cell ``index`` on ``rank``, by child pid."""
        prefix = self._stray_prefix(index, rank)
        try:
            names = os.listdir(self.strays)
        except OSError:
            return {}
        return {n[len(prefix):]: self.strays / n for n in sorted(names) if n.startswith(prefix)}

    @staticmethod
    def _stray_prefix(index: int, rank: int) -> str:
        return f"{index}.r{rank}."


@dataclass(frozen=True, slots=True)
class CompileFolder(_JobFolder):
    """A compile job's folder: its job file, its log and its markers (rank 0 only: a
    compile runs no world)."""

    @property
    def job_file(self) -> Path:
        """The job file (:class:`~cpmatrix.worker.protocol.records.CompileJob`)."""
        return self.path / "job.json"

    @property
    def log(self) -> Path:
        """The compile subprocess's stdout and stderr."""
        return self.path / "spill.log"
