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
from cpmatrix.report.history import CellHistory, durations_of, load_run_history, read_histories
from cpmatrix.report.junit import merge_junit
from cpmatrix.report.merge import ShardManifest, selection_digest
from cpmatrix.run.balance import parse_shard, shard_cells
from cpmatrix.run.options import RunOptions

__all__ = ["Recorded", "take_shard", "write_empty_report"]


class Recorded:
    """A run's recorded durations (``--durations-from FILE``, else ``--out``'s own) and
    histories, each read once, when first needed by the shard or the Slurm split (most
    runs need neither). The session reads ``--out``'s own history itself, every run.

    >>> from cpmatrix.run.options import RunOptions
    >>> Recorded(RunOptions(), Path("no/such/out")).durations()
    {}
    """

    def __init__(self, options: RunOptions, out: Path) -> None:
        self.options = options
        self.out = out
        self._durations: dict[str, float] | None = None
        self._history: dict[str, CellHistory] | None = None

    def durations(self) -> dict[str, float]:
        """``--durations-from FILE`` if given (a missing or unreadable one is a usage error: the
        shards would silently stop being balanced), else ``--out``'s own durations.json."""
        if self._durations is None:
            history = self.history()
            self._durations = (durations_of(load_run_history(self.out)) if history is None
                               else durations_of(history))
        return self._durations

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
    (:func:`cpmatrix.run.balance.shard_cells`), so the N jobs need not coordinate.
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
