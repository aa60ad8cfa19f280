"""The typed files of the protocol: job files, markers, outcomes, pid and left files.

A supervisor writes a **job file** (:class:`WorldSpec`, :class:`CompileJob`) and starts
the child; the child writes, per cell, a :class:`StartMarker` before the cell runs and an
:class:`Outcome` (the done marker) after it, both atomically and both carrying the run's
id; a world's ranks also write a :class:`PidFile` each and a :class:`RankLeft` when they
exit normally; the fork launcher writes a :class:`RootCause` when a rank fails first. A
file of another run, or one that does not parse as its type, is ignored by the reader
(``None``), never mistaken for this run's evidence. Where each file lives:
:mod:`cpmatrix.worker.protocol.folders`.

Example::

    >>> spec = CellSpec(id="t[unit,1x2,fp64,autocast=off,reference]@cpu", target="t",
    ...                 case="m:f", rows=1, cols=2, dtype="fp64", out_dir="cells/t")
    >>> CellSpec.from_json(spec.to_json()) == spec, spec.world_size
    (True, 2)
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

from cpmatrix.defaults import TIMEOUT_S
from cpmatrix.fsutil import atomic_write_json, read_json

if TYPE_CHECKING:  # the ranks never import the spec's modules
    from cpmatrix.matrix.schema import Cell

__all__ = [
    "ERROR",
    "OK",
    "CellSpec",
    "CompileJob",
    "Outcome",
    "OutcomeStatus",
    "PidFile",
    "PytestSpec",
    "RankLeft",
    "RootCause",
    "StartMarker",
    "WorldSpec",
    "read_typed",
    "write_typed",
]

T = TypeVar("T")
#: What a rank says of a cell it ran: it passed there, or it did not.
OutcomeStatus = Literal["ok", "error"]
OK: Final = "ok"
ERROR: Final = "error"


class _Json:
    """``to_json``/``from_json`` for the frozen dataclasses below (nested specs too)."""

    def to_json(self) -> dict[str, Any]:
        value: dict[str, Any] = dataclasses.asdict(self)  # type: ignore[call-overload]
        return value

    @classmethod
    def from_json(cls: type[T], data: Any) -> T:
        """Build from a mapping; ``ValueError`` for a missing field or a wrong shape."""
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__}: expected a mapping, got {type(data).__name__}")
        known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        values = {k: v for k, v in data.items() if k in known}
        for name in known:
            nested = _NESTED.get((cls.__name__, name))
            if nested is not None and name in values:
                values[name] = [nested.from_json(item) for item in values[name]]
            one = _NESTED_ONE.get((cls.__name__, name))
            if one is not None and values.get(name) is not None:
                values[name] = one.from_json(values[name])
        try:
            return cls(**values)
        except TypeError as exc:
            raise ValueError(f"{cls.__name__}: {exc}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class PytestSpec(_Json):
    """What a pytest cell's ranks need to run its test
    (:mod:`cpmatrix.kinds.pytest.rank_session`); none of it is the user's ``cell.params``."""

    #: The test's pytest node id, as collected.
    nodeid: str
    #: How the test asks for ranks (``kinds.pytest.spec.DIALECTS``).
    dialect: str = ""
    #: The pytest session it was collected in (``kinds.pytest.session_spec.PytestSession``, as
    #: JSON): the rank re-creates it once for all the world's tests.
    session: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class CellSpec(_Json):
    """One cell as a child process runs it: every axis already parsed.

    Why a shape of its own between the matrix's ``Cell`` and the case's ``CellContext``:
    it crosses the process boundary as JSON (the world or compile job file), read back
    typed by a process that runs none of the matrix's modules (a world's processes import
    nothing of ``cpmatrix.matrix``: ``tests/unit/test_architecture.py``); and it is one
    run of the cell (its ``out_dir``, the kind's payload), not the matrix's cell.
    """

    id: str
    target: str
    case: str
    rows: int
    cols: int
    dtype: str
    out_dir: str
    level: str = "unit"
    kind: str = "parity"
    autocast: bool = False
    path: str = "reference"
    params: dict[str, Any] = field(default_factory=dict)
    platform: str = "cpu"
    timeout_s: int = TIMEOUT_S
    #: The planted bug switched on for this run ("" for none).
    mutant: str = ""
    #: Which run of the cell (``--runs-per-test``): 1..N; its seed derives from it.
    run_number: int = 1
    #: The file the cell's digest covers; the worker refuses to run another.
    case_file: str = ""
    #: For compile cells: the kernel's compile spec (``SpillBlock.for_cell``).
    spill: dict[str, Any] | None = None
    #: For pytest cells: the test to run (never in ``params``, the target's axes).
    pytest: PytestSpec | None = None

    @property
    def world_size(self) -> int:
        return self.rows * self.cols

    @classmethod
    def of_world(cls, id: str, *, world_size: int, platform: str, out_dir: str) -> CellSpec:
        """A cell of no matrix: the whole world as one ``1xN`` mesh, every other axis at
        its default (a test run natively under ``torchrun -m pytest``, the pytest
        plugin's ``cell`` fixture).

        >>> spec = CellSpec.of_world("t.py::x", world_size=4, platform="cpu", out_dir="o")
        >>> spec.world_size, spec.dtype, spec.path, spec.params
        (4, 'fp64', 'reference', {})
        """
        return cls(id=id, target="", case="", rows=1, cols=world_size, dtype="fp64",
                   out_dir=out_dir, platform=platform)

    @classmethod
    def from_cell(cls, cell: Cell, *, out_dir: str, mutant: str = "",
                  run_number: int = 1) -> CellSpec:
        """The one copy of a cell's fields into the spec a child runs (the axes parsed).

        >>> from cpmatrix.matrix.schema import Cell, Mesh
        >>> cell = Cell(id="t@cpu", target="t", case="m:f", kind="parity", level="unit",
        ...     mesh=Mesh.parse("1x2"), dtype="fp64", autocast=False, path="reference",
        ...     params=(("seq", 7),), platform="cpu", timeout_s=60, tags=())
        >>> spec = CellSpec.from_cell(cell, out_dir="cells/t@cpu")
        >>> spec.world_size, spec.params, spec.timeout_s
        (2, {'seq': 7}, 60)
        """
        return cls(
            id=cell.id, target=cell.target, case=cell.case, case_file=cell.case_file,
            kind=cell.kind, level=cell.level, rows=cell.mesh.rows, cols=cell.mesh.cols,
            dtype=cell.dtype, autocast=cell.autocast, path=cell.path, params=dict(cell.params),
            platform=cell.platform, timeout_s=cell.timeout_s, mutant=mutant,
            out_dir=out_dir, run_number=run_number, spill=cell.spill_spec() or None,
            pytest=PytestSpec.from_json(json.loads(cell.pytest)) if cell.pytest else None,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class WorldSpec(_Json):
    """The job file of a world (``world.json``), whichever launcher starts its ranks."""

    name: str
    run_id: str
    supervisor_pid: int
    dir: str
    out_root: str
    backend: str
    device: str
    platform: str
    pg_timeout_s: float
    pythonpath: list[str]
    project_roots: list[str]
    #: In the order every rank runs its own cells (by planned start).
    cells: list[CellSpec]
    #: Per cell, the world ranks it runs on, in its own rank order (empty: ``0..k-1``).
    placement: list[list[int]] = field(default_factory=list)
    #: ``module:function`` each rank calls as ``fn(world, rank)`` once, before the
    #: isolation baseline is taken (so what it sets up is part of every cell's starting
    #: state): the pytest front's in-rank session (:mod:`cpmatrix.kinds.pytest.rank_session`).
    #: Empty: none.
    prepare: str = ""
    #: ``--profile``: each rank prints a ``PROFILE`` line per cell into its log (the
    #: cell's environment, isolation checks, barrier, group check and setup times).
    profile: bool = False

    def ranks_of(self, index: int) -> tuple[int, ...]:
        """The world ranks cell ``index`` runs on; its rank ``r`` is ``ranks_of(i)[r]``.

        >>> w = WorldSpec(name="w", run_id="r", supervisor_pid=1, dir="d", out_root="o",
        ...     backend="gloo", device="cpu", platform="cpu", pg_timeout_s=60.0,
        ...     pythonpath=[], project_roots=[], placement=[[4, 5]], cells=[CellSpec(
        ...     id="c", target="t", case="m:f", rows=1, cols=2, dtype="fp64", out_dir="x")])
        >>> w.ranks_of(0)
        (4, 5)
        """
        if self.placement:
            return tuple(self.placement[index])
        return tuple(range(self.cells[index].world_size))


@dataclass(frozen=True, slots=True, kw_only=True)
class CompileJob(_Json):
    """The job file of a compile subprocess (``job.json``)."""

    run_id: str
    #: The job's folder (:class:`~cpmatrix.worker.protocol.folders.CompileFolder`): its
    #: markers go there.
    folder: str
    cache_dir: str | None
    search_path: list[str]
    cells: list[CellSpec]
    #: The run's output folder: what the cells write there is not what they read.
    out_root: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class StartMarker(_Json):
    """Written before cell ``index`` runs on ``rank`` (its rank in the cell)."""

    index: int
    rank: int
    id: str
    run: str
    time: float
    #: This rank's log size when the cell started (its log tail starts there).
    log_offset: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome(_Json):
    """What cell ``index`` did on ``rank`` (its rank in the cell; the done marker), before
    any cross-rank step."""

    index: int
    rank: int
    id: str
    run: str
    status: OutcomeStatus
    exc_type: str = ""
    message: str = ""
    traceback: str = ""
    #: The toolkit check that raised (``ParityError.check``), if any.
    check: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    setup_s: float = 0.0
    case_s: float = 0.0
    duration_s: float = 0.0
    end_time: float = 0.0
    log_end: int | None = None
    #: The case changed process state that cannot be restored: the world is recycled.
    recycle: bool = False
    #: False while the rank still checks the groups the cell used (after the store
    #: barrier, :mod:`cpmatrix.worker.hygiene`): the rank rewrites this file, final, once
    #: it knows. A reader knows the rank left the case; the verdict is the final file's.
    final: bool = True
    #: What the cell read on this rank (:mod:`cpmatrix.worker.observe`): path ->
    #: signature. None when it was not observed (such a pass is never cached).
    reads: dict[str, str] | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass(frozen=True, slots=True, kw_only=True)
class PidFile(_Json):
    """``rank<R>.pid``: so the supervisor can watch and signal the rank."""

    pid: int
    rank: int
    run: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RankLeft(_Json):
    """``rank<R>.left``: the rank ran out of cells and is exiting normally (exit 0).

    With cells packed onto ranks, a rank's last cell may end long before the world's:
    its exit is no fault, and the supervisor must not read it as a dead rank.
    """

    rank: int
    run: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RootCause(_Json):
    """The fork launcher's first observed failure: the world rank that ended first with a
    non-zero status (``WorldFolder.root_cause``).

    Written once, before the launcher kills the other ranks; the supervisor reads it to
    name the rank that died (torchrun's own launcher prints a text block instead, which
    the supervisor parses for that launcher only). It carries the run's id, as every file
    a rank or launcher writes does: world names repeat from run to run, and a straggling
    launcher of an earlier run sharing ``--out`` must not name this run's culprit.

    >>> RootCause.from_json(RootCause(run="r1", rank=1, exitcode=-9, pid=42, time=0.0)
    ...                     .to_json())
    RootCause(run='r1', rank=1, exitcode=-9, pid=42, time=0.0)
    """

    #: The run the launcher's world belongs to.
    run: str
    #: The world rank.
    rank: int
    #: Its exit code, or minus the signal that killed it (torchrun's convention).
    exitcode: int
    pid: int
    #: When the launcher saw it end (seconds since the epoch).
    time: float


_NESTED: dict[tuple[str, str], type[_Json]] = {
    ("WorldSpec", "cells"): CellSpec,
    ("CompileJob", "cells"): CellSpec,
}
#: Fields holding one nested record, or None.
_NESTED_ONE: dict[tuple[str, str], type[_Json]] = {
    ("CellSpec", "pytest"): PytestSpec,
}


def write_typed(path: str | os.PathLike[str], value: _Json) -> None:
    """Write atomically (a reader never sees half a file)."""
    atomic_write_json(path, value.to_json())


def read_typed(path: str | os.PathLike[str], cls: type[T], run: str | None = None) -> T | None:
    """The file as ``cls``; None when it is missing, malformed, or (``run`` given) another
    run's."""
    try:
        value = cls.from_json(read_json(Path(path)))  # type: ignore[attr-defined]
    except (OSError, ValueError):
        return None
    if run is not None and getattr(value, "run", getattr(value, "run_id", None)) != run:
        return None
    return value  # type: ignore[no-any-return]
