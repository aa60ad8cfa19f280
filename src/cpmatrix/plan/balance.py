"""Time balancing: worlds onto Slurm jobs, cells onto CI shards. Pure; no processes.

Two uses of one greedy rule, longest-first onto the least-loaded bin (LPT, as large CI
systems split test suites): :func:`balance` places weighted items on ``n`` bins and
reports the expected makespan; :func:`shard_cells` partitions a run's cells into ``n``
shards by their recorded durations, dealing the cells with no record round-robin.

Both are stable: the same inputs give the same bins, whatever order the items came in
(ties break on the item's name, then on the lowest bin index), so N independent CI jobs
that each compute the partition agree on it without talking to each other.

Example::

    >>> plan = balance({"a": 5.0, "b": 3.0, "c": 3.0, "d": 1.0}, 2)
    >>> plan.bins, plan.makespan
    ((('a', 'd'), ('b', 'c')), 6.0)
    >>> shard_cells(["x", "y", "z", "new1", "new2"], {"x": 4.0, "y": 2.0, "z": 2.0}, 2)
    (('x', 'new1'), ('y', 'z', 'new2'))
    >>> parse_shard("2/8")
    (2, 8)
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cpmatrix.errors import UsageError

__all__ = ["Balance", "balance", "parse_shard", "shard_cells"]


@dataclass(frozen=True, slots=True)
class Balance:
    """Items per bin (each longest-first) and each bin's total expected time."""

    bins: tuple[tuple[str, ...], ...]
    loads: tuple[float, ...]

    @property
    def makespan(self) -> float:
        """The expected wall time when every bin runs at once: the heaviest bin."""
        return max(self.loads, default=0.0)


def balance(weights: Mapping[str, float], n: int) -> Balance:
    """Greedy longest-first onto the least-loaded of ``n`` bins (ties: lowest index).

    LPT is within 4/3 of the optimal makespan; it is what a pool of ``n`` workers does
    when each takes the longest item left as soon as it is free, so the plan it prints
    is also what a dynamic dispatch of the same items achieves when the weights are right.

    >>> balance({}, 3).bins
    ((), (), ())
    """
    if n < 1:
        raise ValueError(f"need at least one bin, got {n}")
    order = sorted(weights, key=lambda k: (-weights[k], k))
    heap = [(0.0, i) for i in range(n)]  # (load, bin index): a tie goes to the lower index
    bins: list[list[str]] = [[] for _ in range(n)]
    loads = [0.0] * n
    for key in order:
        load, i = heapq.heappop(heap)
        bins[i].append(key)
        loads[i] = load + max(0.0, weights[key])
        heapq.heappush(heap, (loads[i], i))
    return Balance(bins=tuple(tuple(b) for b in bins), loads=tuple(loads))


def shard_cells(cell_ids: Iterable[str], durations: Mapping[str, float],
                n: int) -> tuple[tuple[str, ...], ...]:
    """Partition ``cell_ids`` into ``n`` shards: every cell in exactly one.

    Cells with a recorded duration are balanced longest-first (:func:`balance`); the
    others have no weight to balance by, so they are dealt round-robin in id order,
    starting after the shards the known cells left lightest (a shard that got little
    known work gets the first unknown cells). Duplicate ids count once.
    """
    ids = sorted(set(cell_ids))
    known = {c: durations[c] for c in ids if c in durations}
    plan = balance(known, n)
    shards = [list(b) for b in plan.bins]
    lightest_first = sorted(range(n), key=lambda i: (plan.loads[i], i))
    unknown = [c for c in ids if c not in known]
    for j, cell in enumerate(unknown):
        shards[lightest_first[j % n]].append(cell)
    return tuple(tuple(s) for s in shards)


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` -> ``(K, N)`` with 1 <= K <= N; a clear :class:`UsageError` otherwise.

    >>> parse_shard("3/2")
    Traceback (most recent call last):
    ...
    cpmatrix.errors.UsageError: --shard 3/2: K must be between 1 and N (got K=3, N=2)
    """
    k_text, sep, n_text = text.partition("/")
    try:
        if not sep:
            raise ValueError
        k, n = int(k_text), int(n_text)
    except ValueError:
        raise UsageError(f"--shard {text}: expected K/N with whole numbers, e.g. 2/8"
                         ) from None
    if n < 1 or not 1 <= k <= n:
        raise UsageError(f"--shard {text}: K must be between 1 and N (got K={k}, N={n})")
    return k, n
