"""``cpmatrix run --shard K/N``: this job's part of the selection, and its manifest.

Example::

    >>> from cpmatrix.matrix.schema import Cell, Mesh
    >>> def c(i): return Cell(id=f"t{i}", target="t", case="m:f", kind="parity",
    ...     level="unit", mesh=Mesh.parse("1x1"), dtype="fp64", autocast=False,
    ...     path="reference", params=(), platform="cpu", timeout_s=60, tags=())
    >>> mine, manifest = take_shard([c(1), c(2), c(3)], "2/2", {"t1": 9.0})
    >>> [x.id for x in mine], manifest.partition
    (['t2'], (('t1', 't3'), ('t2',)))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from cpmatrix.errors import UsageError
from cpmatrix.fsutil import atomic_write_json
from cpmatrix.layout import DURATIONS, RunLayout
from cpmatrix.matrix.schema import Cell
from cpmatrix.plan.balance import parse_shard, shard_cells
from cpmatrix.plan.packing import PackSpec
from cpmatrix.report.history import (
    CellHistory,
    durations_of,
    load_run_history,
    merge_histories,
    read_histories,
)
from cpmatrix.report.junit import merge_junit
from cpmatrix.report.merge import ShardManifest, selection_digest
from cpmatrix.supervise.options import RunOptions

__all__ = ["Recorded", "take_shard", "write_empty_report"]


class Recorded:
    """A run's recorded histories, each file read once, when first needed: ``--durations-from
    FILE``'s (balancing shards and Slurm jobs) and ``--out``'s own (what the worlds pack
    by, and what the run's history starts from).

    >>> from cpmatrix.supervise.options import RunOptions
    >>> Recorded(RunOptions(), Path("no/such/out")).durations()
    {}
    >>> Recorded(RunOptions(), Path("no/such/out")).planning(PackSpec(ordered=True))
    {}
    """

    def __init__(self, options: RunOptions, out: Path) -> None:
        self.options = options
        self.out = out
        self._durations: dict[str, float] | None = None
        self._history: dict[str, CellHistory] | None = None
        self._own: dict[str, CellHistory] | None = None
        self._merged: dict[str, CellHistory] | None = None

    def durations(self) -> dict[str, float]:
        """``--durations-from FILE`` if given (a missing or unreadable one is a usage error: the
        shards would silently stop being balanced), else ``--out``'s own durations.json."""
        if self._durations is None:
            history = self.history()
            self._durations = durations_of(self.own() if history is None else history)
        return self._durations

    def own(self) -> dict[str, CellHistory]:
        """``--out``'s own histories (none when it has no durations.json)."""
        if self._own is None:
            self._own = load_run_history(self.out)
        return self._own

    def merged(self) -> dict[str, CellHistory]:
        """``--durations-from``'s histories with ``--out``'s own over them (this folder's
        records win): what the run's history starts from, and what its worlds pack by."""
        if self._merged is None:
            self._merged = merge_histories([self.history() or {}, self.own()])
        return self._merged

    def planning(self, pack: PackSpec) -> dict[str, float]:
        """Expected seconds per cell that the worlds pack their cells onto their ranks by:
        none with ``--order`` or ``--failed-first`` (``pack.ordered``), so that one order
        always gives one placement; else :meth:`merged`'s."""
        return {} if pack.ordered else durations_of(self.merged())

    def history(self) -> dict[str, CellHistory] | None:
        """``--durations-from FILE``'s histories, None without the flag."""
        if self._history is None and self.options.durations_from:
            self._history = _recorded_history(self.options)
        return self._history


def _recorded_history(options: RunOptions) -> dict[str, CellHistory]:
    """``--durations-from FILE``'s histories (either form of the file; see
    :mod:`cpmatrix.report.history`), or a usage error naming the file."""
    path = Path(options.durations_from or DURATIONS)
    try:
        return read_histories(path)
    except OSError as exc:
        raise UsageError(f"--durations-from {path}: not a durations.json ({exc})") from None
    except ValueError as exc:
        raise UsageError(f"--durations-from: not a durations.json: {exc}") from None


def take_shard(cells: Sequence[Cell], spec: str, durations: Mapping[str, float]
               ) -> tuple[list[Cell], ShardManifest]:
    """The cells of shard ``spec`` ("K/N"), in selection order, and the shard's manifest.

    Every shard job computes the same partition from the same selection and durations
    (:func:`cpmatrix.plan.balance.shard_cells`), so the N jobs need not coordinate.
    """
    k, n = parse_shard(spec)
    ids = [c.id for c in cells]
    partition = shard_cells(ids, durations, n)
    mine = set(partition[k - 1])
    taken = [c for c in cells if c.id in mine]
    return taken, ShardManifest(shard=k, of=n, selection=selection_digest(ids),
                                partition=partition)


def write_empty_report(out: Path, run_id: str,
                       source: Mapping[str, object] | None = None) -> None:
    """A shard with no cells still leaves a (empty) report for the merge to read, and
    its ``run.json`` the source of the whole selection (``source``)."""
    layout = RunLayout(out)
    for stale in (layout.report_xml, layout.results):
        stale.unlink(missing_ok=True)
    merge_junit([], layout.report_xml, run_id=run_id)
    atomic_write_json(layout.results, [])
    atomic_write_json(layout.run_info, {"run_id": run_id, "source": dict(source or {})})
