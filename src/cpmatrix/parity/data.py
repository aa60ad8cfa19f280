"""ONE synthetic data stack and the toolkit's distributor, shared by data/module/workflow tests.

Tests do not hand-roll features with ad-hoc ``randint``/``randn``: they draw them from
:class:`SyntheticDataModule`, which synthesizes a feature dict with declared names, axes,
dtypes, masks and value ranges (:data:`FEATURES`) and hands out both views:

- the **serial** view: the features as a single device sees them, unpadded;
- the **CP** view: the same features through :func:`distribute`, the toolkit's distributor
  (or the project's own, ``distributor=``), which
  pads every axis to divisibility, lays grouped axes (atoms) out per shard of their parent
  axis (tokens), remaps index features into the new layout, and shards by the declared
  placements.

Because every module test goes through the same distributor at the declared placements,
the featurizer -> module seam (and the distributor's padding and index remapping) is
exercised by every unit test, not only by the end-to-end one.

The contract lives in :mod:`cpmatrix.parity.features`, the pure layout and
:func:`distribute` in :mod:`cpmatrix.parity.layout`; this module synthesizes, loads and
hands out both views (:func:`distribute_features` is the feature-dict distributor).

Example (inside a case)::

    dm = SyntheticDataModule.for_cell(cell, feature_subset=("token_feats", "token_mask"))
    batch = dm.batch(cell.mesh)
    batch.serial["token_feats"].shape      # (N, 8): the serial view
    batch.cp["token_feats"]                 # a DTensor, padded to R*C and sharded
    full = batch.to_serial(cp_out, ("N", None))   # back to the serial layout to compare
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, Dataset

from cpmatrix.parity.dtypes import storage_dtype
from cpmatrix.parity.features import (
    AXES,
    FEATURES,
    N_RESTYPES,
    PAIR_FEATS,
    REL_CLIP,
    SPECS_BY_NAME,
    TOKEN_FEATS,
    AxisName,
    AxisSpec,
    FeatureSpec,
    placements_of,
    validate_features,
)
from cpmatrix.parity.layout import AxisLayout, Layout, compute_layout, distribute

__all__ = [
    "AXES",
    "FEATURES",
    "PAIR_FEATS",
    "TOKEN_FEATS",
    "AxisLayout",
    "AxisSpec",
    "FeatureBatch",
    "FeatureDistributor",
    "FeatureSpec",
    "Layout",
    "SyntheticDataModule",
    "SyntheticFeatureDataset",
    "collate_single",
    "compute_layout",
    "distribute",
    "distribute_features",
    "make_dataloader",
    "placements_of",
    "validate_features",
]

# --------------------------------------------------------------------------------------
# synthesis, validation


def _synthesize(gen: torch.Generator, n_tokens: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    def randint(low: int, high: int, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=gen)

    def randn(*shape: int) -> torch.Tensor:
        # drawn in float64, then cast: the same logical values in every dtype's cell
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)

    n = n_tokens
    token_index = randint(0, 5, (1,)) + torch.cumsum(randint(1, 3, (n,)), 0) - 1
    token_mask = torch.rand(n, generator=gen) < 0.85
    token_mask[randint(0, n, (1,))] = True  # at least one valid token
    rel = (token_index[None, :] - token_index[:, None]).clamp(-REL_CLIP, REL_CLIP) + REL_CLIP
    counts = randint(1, 4, (n,))
    atom_to_token = torch.repeat_interleave(torch.arange(n), counts)
    first_atom = torch.cumsum(counts, 0) - counts
    rep = first_atom + (torch.rand(n, generator=gen) * counts).long()
    n_atoms = int(counts.sum())
    return {
        "token_index": token_index,
        "restype": randint(0, N_RESTYPES, (n,)),
        "token_mask": token_mask,
        "token_feats": randn(n, TOKEN_FEATS),
        "pair_feats": randn(n, n, PAIR_FEATS),
        "rel_pos": rel,
        "atom_to_token": atom_to_token,
        "atom_coords": randn(n_atoms, 3) * 3,
        "atom_mask": torch.rand(n_atoms, generator=gen) < 0.9,
        "token_to_rep_atom": rep,
    }


class SyntheticFeatureDataset(Dataset[dict[str, torch.Tensor]]):
    """Sample ``i`` is a serial feature dict, deterministic from ``(seed, i)``.

    ``feature_subset`` keeps only the named features (all are synthesized, so values do not
    depend on the subset). Example::

        >>> ds = SyntheticFeatureDataset(seed=1, n_tokens=5, feature_subset=("token_mask",))
        >>> sorted(ds[0]), ds[0]["token_mask"].shape
        (['token_mask'], torch.Size([5]))
    """

    def __init__(
        self,
        *,
        seed: int,
        n_samples: int = 1,
        n_tokens: int = 7,
        dtype: torch.dtype = torch.float64,
        feature_subset: Sequence[str] | None = None,
    ) -> None:
        if feature_subset is not None:
            unknown = sorted(set(feature_subset) - set(SPECS_BY_NAME))
            if unknown:
                raise ValueError(f"unknown features {unknown} (declared: {sorted(SPECS_BY_NAME)})")
        if n_tokens < 1 or n_samples < 1:
            raise ValueError(f"n_tokens and n_samples must be >= 1, got {n_tokens}, {n_samples}")
        self.seed = seed
        self.n_samples = n_samples
        self.n_tokens = n_tokens
        self.dtype = dtype
        self.feature_subset = tuple(feature_subset) if feature_subset is not None else None

    def __len__(self) -> int:
        return self.n_samples

    def full_item(self, index: int) -> dict[str, torch.Tensor]:
        """All declared features of sample ``index`` (the layout needs the grouping ones)."""
        if not 0 <= index < self.n_samples:
            raise IndexError(f"sample {index} of {self.n_samples}")
        # an explicit generator: never touches the global RNG of the run under test
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + index) % (2**63))
        return _synthesize(gen, self.n_tokens, self.dtype)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.subset(self.full_item(index))

    def subset(self, features: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        keep = self.feature_subset
        return {k: v for k, v in features.items() if keep is None or k in keep}


def collate_single(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The collate of CP models here: batch size 1, no batch dim (CP splits one sample)."""
    if len(items) != 1:
        raise ValueError(f"CP batches hold one sample, got {len(items)}")
    return items[0]


def make_dataloader(dataset: SyntheticFeatureDataset) -> DataLoader[dict[str, torch.Tensor]]:
    """Batch size 1, in order, in-process (workers would fork the test's RNG state)."""
    return DataLoader(
        dataset, batch_size=1, shuffle=False, num_workers=0, collate_fn=collate_single
    )


@dataclass(frozen=True, slots=True)
class FeatureBatch:
    """One sample in both views, with the layout that maps between them."""

    serial: dict[str, torch.Tensor]
    cp: dict[str, Any]
    layout: Layout
    mesh: Any
    sizes: dict[str, int] = field(default_factory=dict)

    def to_serial(self, value: Any, axes: Sequence[AxisName | int | None]) -> torch.Tensor:
        """A CP result (DTensor or full tensor) back in the serial layout, to compare."""
        return self.layout.to_serial(value, axes)

    def distribute(
        self,
        value: torch.Tensor,
        placements: Sequence[Any],
        axes: Sequence[AxisName | int | None],
        *,
        pad: float = 0,
        requires_grad: bool = False,
    ) -> Any:
        """An activation (serial layout) into the CP view, through :func:`distribute`."""
        return distribute(
            value,
            self.mesh,
            placements,
            axes=axes,
            layout=self.layout,
            pad=pad,
            requires_grad=requires_grad,
        )

    def axis_size(self, axis: AxisName) -> int:
        """The serial size of a symbolic axis (``"N"``: number of tokens)."""
        return self.layout.axes[axis].size


class SyntheticDataModule:
    """Dataset + DataLoader + the CP view, deterministic from one seed.

    Example::

        dm = SyntheticDataModule.for_cell(cell, feature_subset=("token_feats", "atom_coords"))
        for serial in dm.dataloader():      # serial feature dicts
            ...
        batch = dm.batch(cell.mesh)          # FeatureBatch: .serial, .cp, .layout
    """

    def __init__(
        self,
        *,
        seed: int,
        dtype: torch.dtype = torch.float64,
        device: Any = "cpu",
        n_tokens: int = 7,
        n_samples: int = 1,
        feature_subset: Sequence[str] | None = None,
        distributor: FeatureDistributor | None = None,
    ) -> None:
        self.distributor: FeatureDistributor = distributor or distribute_features
        self.dataset = SyntheticFeatureDataset(
            seed=seed,
            n_samples=n_samples,
            n_tokens=n_tokens,
            dtype=dtype,
            feature_subset=feature_subset,
        )
        self.device = torch.device(device)

    @classmethod
    def for_cell(cls, cell: Any, **kwargs: Any) -> SyntheticDataModule:
        """Seeded from ``cell.seed``, in the cell's storage dtype on ``cell.device``."""
        kwargs.setdefault("seed", cell.seed)
        kwargs.setdefault("dtype", storage_dtype(cell))
        kwargs.setdefault("device", cell.device)
        return cls(**kwargs)

    def dataloader(self) -> DataLoader[dict[str, torch.Tensor]]:
        return make_dataloader(self.dataset)

    def batch(self, mesh: Any, index: int = 0) -> FeatureBatch:
        """Sample ``index`` as serial and CP views (every rank builds the same one)."""
        full = {k: v.to(self.device) for k, v in self.dataset.full_item(index).items()}
        return self.cp_view(full, mesh, keep=self.dataset.feature_subset)

    def cp_view(
        self,
        features: Mapping[str, torch.Tensor],
        mesh: Any,
        *,
        keep: Sequence[str] | None = None,
    ) -> FeatureBatch:
        """Serial features (synthetic or real) -> :class:`FeatureBatch` via the distributor."""
        return self.distributor(features, mesh, keep=keep)


class FeatureDistributor(Protocol):
    """Serial feature dict -> :class:`FeatureBatch`. The default is
    :func:`distribute_features`; a project with its own production distributor passes an
    adapter around it, so module tests exercise the real one (never a re-implementation)."""

    def __call__(
        self, features: Mapping[str, torch.Tensor], mesh: Any, *, keep: Sequence[str] | None = None
    ) -> FeatureBatch: ...


def distribute_features(
    features: Mapping[str, torch.Tensor],
    mesh: Any,
    *,
    keep: Sequence[str] | None = None,
    specs: Iterable[FeatureSpec] = FEATURES,
) -> FeatureBatch:
    """Validate, lay out (:func:`compute_layout`) and :func:`distribute` every feature at its
    declared placements; ``keep`` selects the features handed out (the layout always uses
    all of them, so a subset has the same layout as the full set)."""
    by_name = {s.name: s for s in specs}
    problems = validate_features(features, specs=by_name.values())
    if problems:
        raise ValueError("features violate the declared contract: " + "; ".join(problems))
    layout = compute_layout(
        {k: v.cpu() for k, v in features.items()}, mesh.size(), specs=by_name.values()
    )
    names = [k for k in features if keep is None or k in keep]
    cp = {}
    for name in names:
        spec = by_name[name]
        cp[name] = distribute(
            features[name],
            mesh,
            spec.placements,
            axes=spec.axes,
            layout=layout,
            pad=spec.pad,
            index_of=spec.index_of,
        )
    serial = {name: features[name] for name in names}
    sizes = {a: lay.size for a, lay in layout.axes.items()}
    return FeatureBatch(serial, cp, layout, mesh, sizes)
