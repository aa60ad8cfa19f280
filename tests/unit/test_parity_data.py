"""The synthetic data stack and the layout half of the distributor (pure, no process group).

The sharding half (DTensors at the declared placements) runs in the token_pool case of
tests/worlds/test_parity_worlds.py on real 1x1, 1x2 and 2x2 worlds.
"""

from __future__ import annotations

import pytest
import torch

from cpmatrix.parity import (
    FEATURES,
    SyntheticDataModule,
    SyntheticFeatureDataset,
    compute_layout,
    validate_features,
)
from cpmatrix.parity.data import AXES, placements_of


def _full(seed: int = 3, n: int = 7) -> dict[str, torch.Tensor]:
    return SyntheticFeatureDataset(seed=seed, n_tokens=n).full_item(0)


def test_features_match_their_declared_contract() -> None:
    for seed in range(5):
        feats = _full(seed, n=3 + seed)
        assert validate_features(feats) == []
        assert set(feats) == {spec.name for spec in FEATURES}


def test_deterministic_from_the_seed_and_independent_of_the_subset() -> None:
    a, b = _full(11), _full(11)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(_full(12)["token_feats"], a["token_feats"])
    sub = SyntheticFeatureDataset(seed=11, feature_subset=("pair_feats", "token_mask"))[0]
    assert sorted(sub) == ["pair_feats", "token_mask"]
    assert torch.equal(sub["pair_feats"], a["pair_feats"])


def test_float_features_have_the_same_values_in_every_dtype() -> None:
    f64 = SyntheticFeatureDataset(seed=5, dtype=torch.float64)[0]["token_feats"]
    f32 = SyntheticFeatureDataset(seed=5, dtype=torch.float32)[0]["token_feats"]
    assert f32.dtype == torch.float32 and torch.equal(f64.float(), f32)


@pytest.mark.parametrize(
    ("name", "corrupt", "message"),
    [
        ("token_index", lambda t: t.flip(0), "not strict monotone"),
        ("restype", lambda t: t + 100, "> declared high"),
        ("atom_to_token", lambda t: t + 50, "out of range for axis 'N'"),
        ("rel_pos", lambda t: t.clamp(max=9), "inconsistent with token_index"),
        ("token_mask", lambda t: t.long(), "dtype torch.int64, declared bool"),
        ("token_feats", lambda t: t[:, :3], "dim 1 is 3, declared 8"),
        ("pair_feats", lambda t: t[:-1], "axis 'N' has size"),
    ],
)
def test_validation_catches_broken_value_semantics(name: str, corrupt, message: str) -> None:  # type: ignore[no-untyped-def]
    feats = _full()
    feats[name] = corrupt(feats[name])
    problems = validate_features(feats)
    assert any(message in p for p in problems), problems


def test_unknown_subset_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown features \\['nope'\\]"):
        SyntheticFeatureDataset(seed=0, feature_subset=("nope",))


def test_dataloader_yields_one_serial_sample_per_batch() -> None:
    dm = SyntheticDataModule(seed=2, n_samples=3, feature_subset=("token_feats",))
    batches = list(dm.dataloader())
    assert len(batches) == 3 and all(b["token_feats"].shape == (7, 8) for b in batches)
    assert not torch.equal(batches[0]["token_feats"], batches[1]["token_feats"])


@pytest.mark.parametrize("world", [1, 2, 3, 4, 6, 9])
def test_layout_pads_to_divisibility_and_keeps_atoms_with_their_tokens(world: int) -> None:
    feats = _full(seed=world, n=7)
    layout = compute_layout(feats, world)
    n, a = layout.axes["N"], layout.axes["A"]
    assert n.padded % world == 0 and a.padded % world == 0
    assert n.padded >= n.size and a.padded >= a.size
    for lay in (n, a):  # positions are distinct and inside the padded axis
        assert len(set(lay.positions.tolist())) == lay.size
        assert int(lay.positions.max()) < lay.padded
    # every atom sits in the same world-size chunk as its token: shards stay local
    token_chunk = n.positions[feats["atom_to_token"]] // (n.padded // world)
    atom_chunk = a.positions // (a.padded // world)
    assert torch.equal(token_chunk, atom_chunk)


@pytest.mark.parametrize("world", [2, 4, 6])
def test_to_cp_remaps_indices_and_to_serial_inverts(world: int) -> None:
    feats = _full(seed=20 + world)
    layout = compute_layout(feats, world)
    coords = layout.to_cp(feats["atom_coords"], ("A", None))
    rep = layout.to_cp(feats["token_to_rep_atom"], ("N",), index_of="A")
    a2t = layout.to_cp(feats["atom_to_token"], ("A",), index_of="N")
    valid_n = layout.valid("N")
    # the remapped index still points at the same atom
    assert torch.equal(coords[rep[valid_n]], feats["atom_coords"][feats["token_to_rep_atom"]])
    # padded index entries point into their own chunk (a local gather stays local)
    chunk_a = torch.arange(layout.axes["A"].padded) // (layout.axes["A"].padded // world)
    chunk_tok = a2t // (layout.axes["N"].padded // world)
    assert torch.equal(chunk_a, chunk_tok)
    # masks pad with False, so padding stays out of every reduction
    mask = layout.to_cp(feats["atom_mask"], ("A",), pad=False)
    assert int(mask.sum()) == int(feats["atom_mask"].sum())
    # round trip, also for a pair tensor laid out on both dims
    assert torch.equal(layout.to_serial(coords, ("A", None)), feats["atom_coords"])
    pair = layout.to_cp(feats["pair_feats"], ("N", "N", None))
    assert pair.shape[:2] == (layout.axes["N"].padded,) * 2
    assert torch.equal(layout.to_serial(pair, ("N", "N", None)), feats["pair_feats"])


def test_to_serial_maps_gradients_back() -> None:
    feats = _full()
    layout = compute_layout(feats, 4)
    x = layout.to_cp(torch.ones(7, 2, dtype=torch.float64), ("N", None)).requires_grad_()
    layout.to_serial(x, ("N", None)).sum().backward()
    assert torch.equal(x.grad[:, 0].bool(), layout.valid("N"))  # pads get no gradient


def test_placement_codes_and_axis_contract() -> None:
    assert [repr(p) for p in placements_of(("S0", "R"))] == ["Shard(dim=0)", "Replicate()"]
    with pytest.raises(ValueError, match="use 'S<dim>' or 'R'"):
        placements_of(("X",))
    assert AXES["A"].group_by == "atom_to_token"
