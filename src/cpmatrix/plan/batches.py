"""Planning: cells -> batches of worlds. Pure; no processes, no torch.

Cells are grouped by platform: one world per platform, with the ranks of its widest
cell (or more: ``--world-ranks``, a GPU host's devices); each cell runs on a set of the
world's ranks in a process group of its own size (see :mod:`cpmatrix.worker.subworld`),
cells on disjoint ranks at once, as :mod:`cpmatrix.plan.packing` places them. Within a
world, cells are ordered by size, largest first, then longest-first by the durations
recorded in earlier runs (else by timeout): the packing's priority. They are then cut
into batches of ``batch_size`` cells (default: one batch per platform, i.e. one world).
``worlds=N`` (``--jobs N``, or ``--max-jobs N`` under Slurm) first splits each platform's
cells into N worlds that run at once, balanced longest-first onto the least-loaded world
by the same expected seconds.

Example::

    >>> from cpmatrix.matrix.schema import Cell, Mesh
    >>> def c(i, mesh): return Cell(id=f"t{i}", target="t", case="m:f", kind="parity",
    ...     level="unit", mesh=Mesh.parse(mesh), dtype="fp64", autocast=False,
    ...     path="reference", params=(), platform="cpu", timeout_s=60, tags=())
    >>> [(b.world_size, [x.id for x in b.cells])
    ...  for b in plan_batches([c(1, "1x1"), c(2, "2x2"), c(3, "2x2")])]
    [(4, ['t2', 't3', 't1'])]
    >>> [(b.world_size, [x.id for x in b.cells])
    ...  for b in plan_batches([c(1, "1x1"), c(2, "2x2"), c(3, "2x2")], worlds=2)]
    [(4, ['t3', 't1']), (4, ['t2'])]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from cpmatrix.matrix.schema import Cell
from cpmatrix.plan.balance import balance
from cpmatrix.plan.packing import Packing, PackSpec

__all__ = ["Batch", "DevicePool", "expected_s", "fit_to_devices", "plan_batches",
           "slot_plan", "world_weights"]


@dataclass(frozen=True, slots=True)
class Batch:
    """Cells that share one world (same platform); ``world_size``: the ranks it launches."""

    name: str
    platform: str
    world_size: int
    cells: tuple[Cell, ...]
    #: Mutant per cell (parallel to ``cells``), empty string for a normal run.
    mutants: tuple[str, ...] = ()
    #: Where and when each cell runs in the world (parallel to ``cells``); None when the
    #: executor does not pack (a compile job).
    packing: Packing | None = None
    #: Expected seconds of the whole batch: the packing's makespan, else the cells' sum.
    expected_s: float = 0.0

    def mutant_of(self, i: int) -> str:
        return self.mutants[i] if self.mutants else ""


def plan_batches(
    cells: Iterable[Cell],
    *,
    durations: Mapping[str, float] | None = None,
    batch_size: int | None = None,
    mutants: Mapping[str, Sequence[str]] | None = None,
    keep_order: bool = False,
    worlds: int = 1,
    pack: PackSpec | None = None,
) -> list[Batch]:
    """Group by platform, split into ``worlds`` balanced worlds, order each
    largest-then-longest first, cut into batches and pack each (``pack``).

    ``mutants`` maps a cell id to the mutants to run it with: each becomes its own
    entry in the batch (the cell run once per mutant, with that mutant switched on).
    """
    durations = durations or {}
    groups: dict[str, list[tuple[Cell, str]]] = {}
    for cell in cells:
        entries = [(cell, m) for m in (mutants or {}).get(cell.id, ())] if mutants else [(cell, "")]
        for entry in entries:
            groups.setdefault(cell.platform, []).append(entry)

    def expected(entry: tuple[Cell, str]) -> float:
        return expected_s(entry[0], durations)

    batches: list[Batch] = []
    for platform in sorted(groups):
        count = 0
        n = 1 if pack is not None and platform in pack.whole else worlds
        for entries in _split(groups[platform], n, expected):
            if keep_order:  # matrix order, to bisect state leaking between cells
                # ... by size all the same: a world switches its group once per size.
                entries.sort(key=lambda e: -e[0].world_size)
            elif pack is not None and pack.ordered:
                pass  # --order: the cells' own order is the priority
            else:
                entries.sort(key=lambda e: (-e[0].world_size, -expected(e), e[0].id, e[1]))
            size = batch_size if batch_size and batch_size > 0 else len(entries)
            for start in range(0, len(entries), size):
                chunk = entries[start : start + size]
                times = [expected(e) for e in chunk]
                packing = None if pack is None else pack.plan(
                    platform, [c.world_size for c, _ in chunk], times)
                world_size = (packing.ranks if packing is not None
                              else max(c.world_size for c, _ in chunk))
                batches.append(
                    Batch(
                        name=f"{platform}-w{world_size}-b{count}",
                        platform=platform,
                        world_size=world_size,
                        cells=tuple(c for c, _ in chunk),
                        mutants=tuple(m for _, m in chunk) if mutants else (),
                        packing=packing,
                        expected_s=packing.makespan if packing is not None else sum(times),
                    )
                )
                count += 1
    # Larger worlds first: they are the slowest to start and the most likely to fail.
    batches.sort(key=lambda b: -b.world_size)
    return batches


def _split(entries: list[tuple[Cell, str]], worlds: int,
           expected: Callable[[tuple[Cell, str]], float]) -> list[list[tuple[Cell, str]]]:
    """``entries`` in up to ``worlds`` groups, longest-first onto the least-loaded (matrix
    order kept inside each group; empty groups dropped)."""
    if worlds <= 1 or len(entries) <= 1:
        return [list(entries)]
    plan = balance({str(i): expected(e) for i, e in enumerate(entries)}, worlds)
    return [[entries[i] for i in sorted(int(k) for k in group)] for group in plan.bins if group]


def expected_s(cell: Cell, durations: Mapping[str, float]) -> float:
    """A cell's expected seconds: its recorded duration, else a sixtieth of its timeout
    (a long timeout usually means a long cell; the same guess orders the batches)."""
    known = durations.get(cell.id)
    return known if known is not None else float(cell.timeout_s) / 60.0


def world_weights(batches: Iterable[Batch]) -> dict[str, float]:
    """Batch name -> its expected seconds (its packing's makespan), for the balancer.

    >>> from cpmatrix.matrix.schema import Cell, Mesh
    >>> def c(i): return Cell(id=f"a{i}", target="t", case="m:f", kind="parity",
    ...     level="unit", mesh=Mesh.parse("1x1"), dtype="fp64", autocast=False,
    ...     path="reference", params=(), platform="cpu", timeout_s=60, tags=())
    >>> world_weights(plan_batches([c(1), c(2)], durations={"a1": 2.5, "a2": 1.0}))
    {'cpu-w1-b0': 3.5}
    >>> world_weights(plan_batches([c(1), c(2)], durations={"a1": 2.5, "a2": 1.0},
    ...                            pack=PackSpec(ranks=(("cpu", 2),))))
    {'cpu-w2-b0': 2.5}
    """
    return {b.name: b.expected_s for b in batches}


def slot_plan(batches: Sequence[Batch], slots: int, *, where: str, unit: str,
              flag: str) -> str:
    """``--dry-run``'s schedule: the batches on ``slots`` slots, longest first, and the
    expected makespan (recorded durations; a sixtieth of the timeout where unknown).

    At run time each slot takes the longest batch left as soon as it is free, which is
    this plan when the durations are right (and adapts when they are not).

    >>> from cpmatrix.matrix.schema import Cell, Mesh
    >>> c = Cell(id="a", target="t", case="m:f", kind="parity", level="unit",
    ...     mesh=Mesh.parse("1x1"), dtype="fp64", autocast=False, path="reference",
    ...     params=(), platform="cpu", timeout_s=60, tags=())
    >>> print(slot_plan(plan_batches([c], durations={"a": 2.0}), 4, where="host",
    ...                 unit="worlds", flag="--jobs"))
    host: 1 worlds on 1 slots (--jobs 4); expected makespan 2.0 s (serial 2.0 s)
      slot 1: 2.0 s: cpu-w1-b0
    """
    weights = world_weights(batches)
    if not weights:
        return f"{where}: no jobs"
    plan = balance(weights, min(slots, len(weights)))
    lines = [f"{where}: {len(weights)} {unit} on {len(plan.bins)} slots "
             f"({flag} {slots}); expected makespan {plan.makespan:.1f} s "
             f"(serial {sum(weights.values()):.1f} s)"]
    for i, (names, load) in enumerate(zip(plan.bins, plan.loads, strict=True), 1):
        lines.append(f"  slot {i}: {load:.1f} s: {', '.join(names)}")
    return "\n".join(lines)


def fit_to_devices(
    cells: Iterable[Cell], *, need: Callable[[Cell], int], devices: int,
) -> tuple[list[Cell], list[tuple[Cell, str]]]:
    """Split ``cells`` into those a host with ``devices`` GPUs can run, and the rest with why.

    ``need(cell)`` is the devices a cell's job holds (its executor says: one per rank for
    a cuda world, since nccl refuses two ranks on one device; none for a CPU world or a
    compile; see docs/gpu.md for why gloo over CUDA tensors is no way around that).
    Order is kept.

    >>> from cpmatrix.matrix.schema import Cell, Mesh
    >>> def c(mesh): return Cell(id=mesh, target="t", case="m:f", kind="parity",
    ...     level="unit", mesh=Mesh.parse(mesh), dtype="fp64", autocast=False,
    ...     path="reference", params=(), platform="cuda", timeout_s=60, tags=())
    >>> fits, left_out = fit_to_devices([c("1x1"), c("2x2")], devices=1,
    ...                                 need=lambda cell: cell.world_size)
    >>> [x.id for x in fits], [(x.id, why) for x, why in left_out]
    (['1x1'], [('2x2', 'needs 4 GPUs (one per rank); 1 visible')])
    """
    fits: list[Cell] = []
    left_out: list[tuple[Cell, str]] = []
    for cell in cells:
        n = need(cell)
        if n > devices:
            left_out.append((cell, f"needs {n} GPUs (one per rank); {devices} visible"))
        else:
            fits.append(cell)
    return fits, left_out


class DevicePool:
    """Disjoint accelerator sets for concurrent worlds (cuda); cpu worlds need none.

    >>> pool = DevicePool(8)
    >>> pool.take(2), pool.take(2), pool.take(8)
    ((0, 1), (2, 3), None)
    """

    def __init__(self, count: int) -> None:
        self.free = list(range(count))

    def take(self, n: int) -> tuple[int, ...] | None:
        if n > len(self.free):
            return None
        taken, self.free = self.free[:n], self.free[n:]
        return tuple(taken)

    def give(self, devices: Sequence[int]) -> None:
        self.free = sorted(set(self.free) | set(devices))
