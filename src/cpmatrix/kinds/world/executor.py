"""The world executor: parity and property cells in worlds of ranks, one per platform.

It plans a platform's cells into worlds (:func:`cpmatrix.plan.batches.plan_batches`), each
packed onto its ranks (:mod:`cpmatrix.plan.packing`), says how many GPUs a world holds,
and makes the :class:`~cpmatrix.kinds.world.job.WorldRun` job that runs one.

Example::

    >>> WorldExecutor().name, WorldExecutor().retries_crashes
    ('world', True)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cpmatrix.kinds.world.job import WorldRun
from cpmatrix.matrix.schema import Cell, Platform
from cpmatrix.plan.batches import Batch, plan_batches
from cpmatrix.plan.packing import Packing, PackSpec, rank_span
from cpmatrix.plan.settings import PlanSettings
from cpmatrix.supervise.context import RunContext
from cpmatrix.supervise.entry import Entry

__all__ = ["WorldExecutor"]


class WorldExecutor:
    """Parity and property cells in worlds of ranks, one world per platform."""

    name = "world"
    kinds: tuple[str, ...] = ("parity", "property")
    noun = "a world"
    plural = "worlds"
    retries_crashes = True
    supports_mutants = True
    starts_worlds = True

    def plan(self, cells: Sequence[Cell], settings: PlanSettings, *,
             durations: Mapping[str, float], worlds: int = 1, pack: PackSpec | None = None,
             mutants: Mapping[str, Sequence[str]] | None = None) -> list[Batch]:
        # ``--keep-order``'s one cell at a time is the pack's (``serial``: setup.pack_spec).
        return plan_batches(cells, durations=durations, batch_size=settings.batch_size,
                            mutants=mutants, keep_order=settings.keep_order, worlds=worlds,
                            pack=pack or PackSpec())

    def devices_needed(self, entries: Sequence[Entry], platform: Platform,
                       pack: PackSpec | None = None) -> int:
        # One device per rank with nccl: the world's ranks (its widest cell's, or more
        # where the host has the devices to run cells side by side).
        if platform.device != "cuda":
            return 0
        return (pack or PackSpec()).world_ranks(platform.name,
                                                [e.cell.world_size for e in entries])

    def job(self, name: str, entries: Sequence[Entry], platform: Platform,
            context: RunContext, devices: tuple[int, ...], *,
            packing: Packing | None = None) -> WorldRun:
        return WorldRun(name, entries, platform, context, devices, packing=packing)

    def describe(self, batch: Batch) -> str:
        line = f"world {batch.name}: {batch.world_size} ranks, {len(batch.cells)} cells"
        p = batch.packing
        if p is None:
            return line
        serial = sum(s.end - s.start for s in p.slots)
        return (f"{line}; expected makespan {p.makespan:.1f} s (one cell at a time "
                f"{serial:.1f} s), up to {p.concurrency} cells at once, ranks busy "
                f"{100 * p.busy:.0f}%")

    def describe_cells(self, batch: Batch) -> list[str]:
        """One line per cell, in the order the world runs them: its ranks and start."""
        p = batch.packing
        if p is None:
            return [f"  {c.id}  timeout={c.timeout_s}s" for c in batch.cells]
        return [f"  {batch.cells[i].id}  ranks {rank_span(p.slots[i].ranks)} at "
                f"{p.slots[i].start:.1f} s  timeout={batch.cells[i].timeout_s}s"
                for i in p.order]

    def cache_identity(self) -> dict[str, str]:
        return {}
