"""The run's output folder (``--out``): every name a run writes there, spelled once.

::

    out/
      .cpmatrix-out  .cpmatrix.lock      the claim (cpmatrix.supervise.outdir)
      report.xml  results.json  report.html  run.json
      timings.json                       when each job (world) started, answered, ended
      durations.json                     the cells' recorded runs (cpmatrix.report.history)
      last-failed.json                   the cells that did not pass when they last ran
                                         (cpmatrix.report.last_failed; repro --failed)
      previous/                          the outputs of the run before (cpmatrix.supervise.outdir)
      shard.json                         a shard's manifest (cpmatrix.report.merge)
      worlds/<world>/                    a world launch's job folder, its torchrun.log ...
      worlds/<world>.junit.xml           its cells' testcases
      spill/<job>/                       a compile job's folder, its spill.log
      cells/<cell>[/mutant-<m>][/run-<k>]/
        rank<r>/output.log  rank<r>/stacks.txt
        work/<world>/                    the cell's cwd, HOME and TMPDIR in one launch

Standard library only: the ranks import it (``worker/world_main.py``, ``cellenv.py``).
What the parent and the ranks exchange inside a world's job folder (pid files, progress
markers, dump requests) is the world protocol's, not named here.

Example::

    >>> out = RunLayout(Path("out"))
    >>> str(out.report_xml), str(out.durations), str(out.world("w0.a1"))
    ('out/report.xml', 'out/durations.json', 'out/worlds/w0.a1')
    >>> cell_output_log(cell_dir("t@cpu"), 1)
    'cells/t@cpu/rank1/output.log'
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "CELLS",
    "DURATIONS",
    "JOB_FOLDERS",
    "LAST_FAILED",
    "LOCK",
    "MARKER",
    "OUTPUTS",
    "OUTPUT_LOG",
    "PREVIOUS",
    "REPORT_HTML",
    "REPORT_XML",
    "RESULTS",
    "RUN_INFO",
    "SHARD_MANIFEST",
    "SPILL",
    "STACKS",
    "TIMINGS",
    "WORLDS",
    "RunLayout",
    "cell_dir",
    "cell_output_log",
    "cell_output_logs",
    "cell_stacks",
    "rank_dir",
    "work_folder",
]

#: Marks a folder cpmatrix created (or adopted empty) as its own.
MARKER: Final = ".cpmatrix-out"
#: Locked by the run that holds the folder; holds that run's pid, host and id.
LOCK: Final = ".cpmatrix.lock"
#: The merged JUnit report, every result as a row, and the page rendered from the report.
REPORT_XML: Final = "report.xml"
RESULTS: Final = "results.json"
REPORT_HTML: Final = "report.html"
#: What the run was: its id, argv, toolchain, source digests, what the caches did.
RUN_INFO: Final = "run.json"
#: Each job of the run (a world, a compile job): when it started, first answered, ended.
TIMINGS: Final = "timings.json"
#: The cells' recorded runs (:mod:`cpmatrix.report.history`): kept from run to run.
DURATIONS: Final = "durations.json"
#: The cells that did not pass when they last ran here (:mod:`cpmatrix.report.last_failed`):
#: kept from run to run.
LAST_FAILED: Final = "last-failed.json"
#: A shard's manifest: which shard of which selection the folder holds.
SHARD_MANIFEST: Final = "shard.json"
#: The folders of the jobs (world launches, compile jobs) and of the cells.
WORLDS: Final = "worlds"
SPILL: Final = "spill"
CELLS: Final = "cells"
#: In a cell's rank folder: what the rank printed during the cell, and its stack dumps.
OUTPUT_LOG: Final = "output.log"
STACKS: Final = "stacks.txt"

#: A cell's folder on one rank is ``rank<r>`` (:func:`rank_dir`).
_RANK: Final = "rank"

#: A previous run's job and cell folders: read as this run's progress if left behind.
JOB_FOLDERS: Final = (WORLDS, CELLS, SPILL)
#: What a run writes: the previous run's copies move to ``previous/`` when a run with
#: cells starts (``durations.json`` and ``last-failed.json`` are kept: records across
#: runs, the planner's history and ``repro --failed``'s list).
OUTPUTS: Final = (REPORT_XML, RESULTS, REPORT_HTML, RUN_INFO, TIMINGS, *JOB_FOLDERS)
#: The outputs of the run before the last one that ran cells (cpmatrix.supervise.outdir).
PREVIOUS: Final = "previous"


@dataclass(frozen=True, slots=True)
class RunLayout:
    """The paths of one output folder ``root``."""

    root: Path

    @property
    def report_xml(self) -> Path:
        return self.root / REPORT_XML

    @property
    def results(self) -> Path:
        return self.root / RESULTS

    @property
    def report_html(self) -> Path:
        return self.root / REPORT_HTML

    @property
    def run_info(self) -> Path:
        return self.root / RUN_INFO

    @property
    def timings(self) -> Path:
        return self.root / TIMINGS

    @property
    def durations(self) -> Path:
        return self.root / DURATIONS

    @property
    def last_failed(self) -> Path:
        return self.root / LAST_FAILED

    @property
    def shard_manifest(self) -> Path:
        return self.root / SHARD_MANIFEST

    @property
    def worlds(self) -> Path:
        return self.root / WORLDS

    def world(self, name: str) -> Path:
        """The job folder of world launch ``name``."""
        return self.worlds / name

    def world_junit(self, batch: str) -> Path:
        """The testcases of the cells batch ``batch`` ran (all its launches)."""
        return self.worlds / f"{batch}.junit.xml"

    def compile_job(self, name: str) -> Path:
        """The folder of compile job ``name``."""
        return self.root / SPILL / name

    def job_folders(self) -> tuple[Path, ...]:
        return tuple(self.root / name for name in JOB_FOLDERS)


def cell_dir(folder: str) -> str:
    """A cell's folder relative to the output folder, from its file-safe name.

    >>> cell_dir("t[unit]@cpu")
    'cells/t[unit]@cpu'
    """
    return f"{CELLS}/{folder}"


def rank_dir(out_dir: str | os.PathLike[str], rank: int) -> Path:
    """Rank ``rank``'s folder in a cell's folder (its rank in the cell): the case's
    ``cell.out_dir``, its :data:`OUTPUT_LOG` and :data:`STACKS`.

    >>> rank_dir("cells/t", 2)
    PosixPath('cells/t/rank2')
    """
    return Path(out_dir, f"{_RANK}{rank}")


def work_folder(out_dir: str, world: str) -> str:
    """A cell's working folder in one world launch, relative to the run's output folder.

    It holds the cell's working directory, ``HOME`` and ``TMPDIR`` (``cwd``, ``home``,
    ``tmp``), shared by the cell's ranks; the supervisor removes it when the cell passed,
    and keeps it (the report names it) when it did not. Per launch, so a rerun
    never meets a kept folder of an earlier attempt.

    >>> work_folder("cells/t[unit]@cpu", "003-cpu-w2-b0.a1")
    'cells/t[unit]@cpu/work/003-cpu-w2-b0.a1'
    """
    return f"{out_dir}/work/{world}"


def cell_output_log(out_dir: str, rank: int) -> str:
    """What rank ``rank`` of a cell printed while it ran (its share of the world's rank
    log), relative to the run's output folder; written by the supervisor for every cell,
    stored with a cached pass and put back on a hit (docs/cache.md).

    >>> cell_output_log("cells/t[unit]@cpu", 1)
    'cells/t[unit]@cpu/rank1/output.log'
    """
    return str(rank_dir(out_dir, rank) / OUTPUT_LOG)


def cell_stacks(out_dir: str, rank: int) -> str:
    """Where rank ``rank`` of a cell dumps every thread's stack when the supervisor asks
    (a cell past its timeout), relative to the run's output folder.

    >>> cell_stacks("cells/t[unit]@cpu", 0)
    'cells/t[unit]@cpu/rank0/stacks.txt'
    """
    return str(rank_dir(out_dir, rank) / STACKS)


def cell_output_logs(cell_folder: str | os.PathLike[str]) -> dict[int, Path]:
    """Every rank's :func:`cell_output_log` found in a cell's folder, by rank."""
    found = {}
    for log in Path(cell_folder).glob(f"{_RANK}*/{OUTPUT_LOG}"):
        rank = log.parent.name.removeprefix(_RANK)
        if rank.isdigit():
            found[int(rank)] = log
    return dict(sorted(found.items()))
