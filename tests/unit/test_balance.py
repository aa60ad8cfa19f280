"""The balancer and the CI shards: pure, on synthetic plans (no worlds, no Slurm)."""

from __future__ import annotations

import random

import pytest

from cpmatrix.errors import UsageError
from cpmatrix.plan.balance import balance, parse_shard, shard_cells


def _synthetic(n: int, seed: int = 15) -> dict[str, float]:
    """Durations shaped like a release matrix: many short cells, a long tail of big worlds."""
    rng = random.Random(seed)
    return {f"cell{i:05d}": round(rng.lognormvariate(1.0, 1.2), 3) for i in range(n)}


def test_ten_thousand_cells_over_32_nodes_are_balanced_within_lpt_bounds() -> None:
    weights = _synthetic(10_000)
    plan = balance(weights, 32)
    placed = [k for b in plan.bins for k in b]
    assert sorted(placed) == sorted(weights), "every item in exactly one bin"
    total = sum(weights.values())
    ideal = max(total / 32, max(weights.values()))  # no schedule beats this lower bound
    # LPT's guarantee is 4/3 of optimal; on many small items it is within a hair of ideal.
    assert plan.makespan <= ideal * 4 / 3
    assert plan.makespan <= ideal * 1.01, (plan.makespan, ideal)
    assert max(plan.loads) - min(plan.loads) <= max(weights.values())
    # Each bin longest-first (a job starts its longest world first).
    for b in plan.bins:
        assert [weights[k] for k in b] == sorted((weights[k] for k in b), reverse=True)
    # Round-robin in id order, the naive split, is visibly worse on the same plan.
    naive = [0.0] * 32
    for i, k in enumerate(sorted(weights)):
        naive[i % 32] += weights[k]
    assert plan.makespan < max(naive)


def test_balance_is_stable_whatever_the_input_order() -> None:
    weights = _synthetic(500)
    shuffled = dict(sorted(weights.items(), key=lambda kv: random.Random(1).random()))
    assert balance(weights, 7) == balance(shuffled, 7)


def test_the_makespan_is_the_heaviest_bin() -> None:
    plan = balance({"a": 7.0, "b": 5.0, "c": 4.0, "d": 3.0, "e": 1.0}, 2)
    assert plan.loads == (10.0, 10.0) and plan.makespan == 10.0
    assert balance({"a": 1.0}, 4).bins == (("a",), (), (), ())
    with pytest.raises(ValueError):
        balance({"a": 1.0}, 0)


@pytest.mark.parametrize("n", [1, 2, 3, 8, 32, 40])
def test_shards_partition_the_cells_exactly_once(n: int) -> None:
    ids = [f"c{i}" for i in range(37)]
    durations = {c: float(i % 5 + 1) for i, c in enumerate(ids) if i % 3}
    shards = shard_cells(ids, durations, n)
    assert len(shards) == n
    flat = [c for s in shards for c in s]
    assert sorted(flat) == sorted(ids) and len(flat) == len(set(flat))
    # Stable: the same inputs in another order give the same shards.
    assert shard_cells(list(reversed(ids)), dict(durations), n) == shards


def test_known_cells_are_time_balanced_and_unknown_ones_dealt_round_robin() -> None:
    durations = {"long": 10.0, "mid1": 5.0, "mid2": 5.0}
    unknown = [f"new{i}" for i in range(6)]
    shards = shard_cells([*durations, *unknown], durations, 2)
    loads = [sum(durations.get(c, 0.0) for c in s) for s in shards]
    assert loads == [10.0, 10.0]
    assert [sum(c.startswith("new") for c in s) for s in shards] == [3, 3]
    # With no record at all, the shards differ in size by at most one.
    sizes = [len(s) for s in shard_cells([f"x{i}" for i in range(10)], {}, 4)]
    assert sorted(sizes) == [2, 2, 3, 3]


@pytest.mark.parametrize("text", ["3/2", "0/2", "1/0", "a/b", "2", "1/2/3", "-1/2"])
def test_a_bad_shard_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="--shard"):
        parse_shard(text)
