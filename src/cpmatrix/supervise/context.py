"""What every executor of one run shares: resolved settings, not command-line flags.

Built once per run by :func:`cpmatrix.supervise.setup.make_context`, in
:func:`cpmatrix.supervise.assembly.assemble`, from the run's options and its placement.

Example::

    >>> from cpmatrix.supervise.runners import get_runner
    >>> ctx = RunContext(out_root=Path("out"), runner=get_runner("local"), run_id="r1")
    >>> ctx.timings.abort_grace_s, ctx.timings.teardown_grace_s
    (5.0, 20.0)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cpmatrix.defaults import LAUNCHER
from cpmatrix.plan.packing import PackSpec
from cpmatrix.supervise.runners.base import Runner
from cpmatrix.supervise.settings import FaultTimings, Launcher

if TYPE_CHECKING:
    from cpmatrix.supervise.executors.spare import Spare

__all__ = ["RunContext"]


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """The run's output folder, runner, interpreter, paths, id and fault timings."""

    out_root: Path
    runner: Runner
    #: This run's id: stamped on every job file and marker, checked when read.
    run_id: str = ""
    #: The interpreter that launches the children (``--python``).
    python: str = sys.executable
    #: How a world's ranks start: ``fork`` (:mod:`cpmatrix.worker.forkrun`) or ``torchrun``.
    launcher: Launcher = LAUNCHER
    #: The children's ``PYTHONPATH``: the matrix's pythonpath, then cpmatrix's import root.
    pythonpath: tuple[str, ...] = ()
    #: The matrix's own pythonpath folders: modules a cell imports from them are
    #: re-imported afresh for the next cell (see :mod:`cpmatrix.worker.isolation`).
    project_roots: tuple[str, ...] = ()
    #: Folders a hermetic runner mounts read-only besides ``pythonpath`` (the matrix's).
    readonly: tuple[str, ...] = ()
    #: How long a world may take at each step before cpmatrix acts (``--abort-grace``, ...).
    timings: FaultTimings = field(default_factory=FaultTimings)
    #: How a world places its cells on its ranks (slots or serial; ranks per world).
    pack: PackSpec = field(default_factory=PackSpec)
    #: Expected seconds per cell id (recorded durations) that worlds are packed by.
    durations: Mapping[str, float] = field(default_factory=dict)
    #: The compile cache of spill cells (None: compile everything).
    compile_cache: Path | None = None
    #: The environment the hermetic allow-list is read from.
    source_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    #: Per cell id, the source identity its results carry (:mod:`cpmatrix.cache.provenance`).
    sources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: ``--order`` as given (``random:SEED`` with its seed), "" for the planner's own.
    order: str = ""
    #: ``--profile``: the ranks print each cell's timings (``WorldSpec.profile``).
    profile: bool = False
    #: The flags a failing cell's repro line carries after its id (``--matrix F`` where
    #: the project's table does not name it); None: no repro line (the pytest front).
    repro: tuple[str, ...] | None = None
    #: A fork launcher started before the run was planned, for its first world that fits
    #: (the pytest front's: :mod:`cpmatrix.supervise.executors.spare`); None: none.
    spare: Spare | None = None
