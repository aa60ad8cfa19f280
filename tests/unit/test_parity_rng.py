"""RNG fingerprints and the entropy property, in one process (ranks simulated by
coordinates; the real multi-rank run is in tests/worlds/test_parity_worlds.py)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cpmatrix.parity import (
    EntropyError,
    ParityError,
    RngRecorder,
    assert_entropy,
    load_fingerprints,
)

COORDS_2x2 = [(0, 0), (0, 1), (1, 0), (1, 1)]


def _draws(fn: Callable[[], Any]) -> Any:
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    return fn()


def _everything() -> list[Any]:
    t = torch.empty(5, dtype=torch.float64)
    return [torch.randn(3), torch.rand(2, 2), torch.randint(0, 9, (4,)), torch.randperm(5),
            t.normal_(), np.random.randn(3), random.random(), random.gauss(0, 1)]


def test_recording_does_not_change_the_run() -> None:
    plain = _draws(_everything)
    with RngRecorder(rank=0, coords=[0, 0], mesh_shape=[1, 1]) as rec:
        recorded = _draws(_everything)
    for a, b in zip(plain, recorded, strict=True):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)
        else:
            assert np.array_equal(a, b)
    sources = [d["source"] for d in rec.draws]
    assert sources == ["torch.randn", "torch.rand", "torch.randint", "torch.randperm",
                       "Tensor.normal_", "numpy.random.randn", "random.random", "random.gauss"]
    assert rec.capture_errors == 0
    assert all(d["label"].startswith("test_parity_rng.py:") for d in rec.draws)


def test_patches_are_removed_on_exit_even_after_an_error() -> None:
    originals = (torch.randn, torch.Tensor.normal_, np.random.randn, random.random)
    with pytest.raises(ZeroDivisionError), RngRecorder(rank=0):
        _ = 1 / 0
    assert (torch.randn, torch.Tensor.normal_, np.random.randn, random.random) == originals
    with RngRecorder(rank=0), pytest.raises(RuntimeError, match="already active"):
        RngRecorder(rank=0).__enter__()


def _world(draw: Callable[[int, int, int], None], coords: list[tuple[int, int]] = COORDS_2x2,
           label: str = "noise") -> list[dict[str, Any]]:
    """Fingerprints of a simulated 2-D world: draw(rank, r, c) runs as each rank."""
    fps = []
    shape = [max(r for r, _ in coords) + 1, max(c for _, c in coords) + 1]
    for rank, (r, c) in enumerate(coords):
        with RngRecorder(rank=rank, coords=[r, c], mesh_shape=shape) as rec, rec.scope(label):
            draw(rank, r, c)
        fps.append(rec.fingerprints())
    return fps


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_independent_shards_and_synced_replicas_pass() -> None:
    fps = _world(lambda rank, r, c: torch.randn(256, generator=_gen(100 + r)))
    report = assert_entropy(fps, sharded=("cp0",), replicated=("cp1",), min_numel=64)
    assert (report.ranks_exercised, report.disjoint_pairs, report.identical_pairs) == (4, 4, 2)


def test_tiled_seed_fails() -> None:
    fps = _world(lambda rank, r, c: torch.randn(256, generator=_gen(100)))
    with pytest.raises(EntropyError, match="share 253 of 253 element windows") as info:
        assert_entropy(fps, sharded=("cp0",), replicated=("cp1",))
    assert info.value.check == "rng_entropy"


def test_overlap_at_an_offset_fails() -> None:
    # rank r's stream starts 100 draws into the same generator: half the values are shared,
    # which a whole-draw digest would miss.
    def draw(rank: int, r: int, c: int) -> None:
        g = _gen(7)
        if r:
            torch.randn(100, generator=g)
        torch.randn(200, generator=g)

    with pytest.raises(EntropyError, match=r"share [1-9][0-9] of 197"):
        assert_entropy(_world(draw), sharded=("cp0",), replicated=("cp1",))


def test_replicas_that_differ_fail() -> None:
    fps = _world(lambda rank, r, c: torch.randn(256, generator=_gen(100 + rank)))
    with pytest.raises(EntropyError, match="differ only on replicated axes"):
        assert_entropy(fps, sharded=("cp0",), replicated=("cp1",))


def test_exercise_threshold() -> None:
    # draws too small to count: the property was never tested
    fps = _world(lambda rank, r, c: torch.randn(4, generator=_gen(100 + r)))
    with pytest.raises(EntropyError, match="exercise threshold: 0 of 4 ranks"):
        assert_entropy(fps, min_numel=16)
    # only rank 0 draws at all
    fps = _world(lambda rank, r, c: torch.randn(64) if rank == 0 else None)
    with pytest.raises(EntropyError, match="exercise threshold: 1 of 4 ranks"):
        assert_entropy(fps, labels=("noise",))
    assert assert_entropy(fps, labels=("noise",), min_ranks=1, sharded=(), replicated=())


def test_no_disjointness_comparison_on_a_live_sharded_axis_fails() -> None:
    # every rank draws, but under different labels: nothing to compare across shards
    fps = [_world(lambda rank, r, c: torch.randn(64), label=f"l{i}")[i] for i in range(4)]
    with pytest.raises(EntropyError, match="disjointness was not tested"):
        assert_entropy(fps, sharded=("cp0", "cp1"), replicated=())


def test_save_and_load_in_the_parent(tmp_path: Path) -> None:
    fps = _world(lambda rank, r, c: torch.randn(128, generator=_gen(r * 2 + c)))
    for fp in fps:
        rec = RngRecorder(rank=fp["rank"], coords=fp["coords"], mesh_shape=fp["mesh_shape"])
        rec.draws = fp["draws"]
        rec.save(tmp_path / f"rank{fp['rank']}")
    (tmp_path / "mutant-x" / "rank0").mkdir(parents=True)  # deeper runs are not mixed in
    (tmp_path / "mutant-x" / "rank0" / "rng_fingerprints.rank0.json").write_text("{}")
    loaded = load_fingerprints(tmp_path)
    assert [fp["rank"] for fp in loaded] == [0, 1, 2, 3]
    assert assert_entropy(loaded, sharded=("cp0", "cp1"), replicated=()).disjoint_pairs == 6


def test_bad_axis_names_are_rejected() -> None:
    # a failure of the check, with the reason (no check raises anything but a ParityError)
    fps = _world(lambda rank, r, c: torch.randn(64))
    with pytest.raises(ParityError, match=r"ValueError: .*axes must be distinct names") as info:
        assert_entropy(fps, sharded=("cp0",), replicated=("cp0",))
    assert info.value.check == "rng_entropy"
    with pytest.raises(ParityError, match="axes must be distinct names"):
        assert_entropy(fps, sharded=("tp",))
