"""What every case of the suite shares: the suite's distributor behind the toolkit's data.

The toolkit's :class:`~cpmatrix.parity.SyntheticDataModule` synthesizes one sample of
features; *how* its CP view is cut is the CP code's business. The distributors here make
that view with the suite's own :func:`cpmatrix.suite.pad_and_shard` (the function the CP
ops and the model use), so a bug in it (mutant ``shard_offset_off_by_one``) shows up in every
case instead of hiding behind a test-only helper:

* :func:`layout_view` - no features, only the sample's layout: activations with a symbolic
  ``"N"`` axis (``TensorSpec(shape=("N", "N", 8))``) are padded and cut by the suite;
* :func:`seq_view` - token features over the flattened mesh
  (:func:`~cpmatrix.suite.seq_placements`), as ring attention and ``CPAttention`` take them;
* :func:`pair_view` - pair features rows over cp0, columns over cp1
  (:func:`~cpmatrix.suite.pair_placements`), plus the pair mask ``token_mask_i & token_mask_j``
  the pair block consumes;
* :func:`model_view` - the small model's :class:`~cpmatrix.suite.model.Batch`, cut by its
  production distributor :func:`~cpmatrix.suite.model.distribute_batch`.

Every view pads the token axis ``N`` to a multiple of ``R * C``: the toolkit's layout
(:func:`~cpmatrix.parity.compute_layout`) and ``distribute_batch`` agree on it, and a
multiple of ``R * C`` is also a multiple of ``lcm(R, C)``, so pair tensors stay square and
divide on both mesh axes.

Example (inside a case)::

    dm = SyntheticDataModule.for_cell(cell, n_tokens=7, distributor=seq_view,
                                      feature_subset=("token_mask",))
    batch = dm.batch(cell.mesh)            # .serial / .cp views, .layout
    check_parity(cell, serial, cp, inputs={"feats": batch, "x": TensorSpec(shape=("N", 8))},
                 placements={"x": seq_placements(0)}, output_axes=("N", None))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import torch
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard

from cpmatrix.parity import (
    FEATURES,
    Check,
    FeatureBatch,
    Layout,
    SyntheticDataModule,
    VacuousError,
    compute_layout,
    mutants,
)
from cpmatrix.suite import (
    MUTANTS,
    pad_and_shard,
    pair_placements,
    planted,
    seq_placements,
)
from cpmatrix.suite.distribute import padded_size
from cpmatrix.suite.model import Batch, distribute_batch

__all__ = [
    "SPECS",
    "SuiteFeatureBatch",
    "data_module",
    "feature_batch",
    "layout_view",
    "local",
    "mesh_label",
    "model_view",
    "pair_view",
    "seq_view",
    "suite_mutants",
    "with_planted",
]

F = TypeVar("F", bound=Callable[..., Any])

#: The toolkit's feature contract by name (axes, pad values, value ranges).
SPECS = {spec.name: spec for spec in FEATURES}


def suite_mutants(*names: str) -> Callable[[F], F]:
    """``@mutants`` for planted bugs of the suite, described by the suite's registry.

    Example::

        @suite_mutants("no_grad_allreduce", "shard_offset_off_by_one")
        def layernorm(cell): ...
    """
    unknown = [n for n in names if n not in MUTANTS]
    if unknown:  # a typo would declare a mutant nothing plants: it would always survive
        raise KeyError(f"unknown suite mutants {unknown}; known: {sorted(MUTANTS)}")
    return mutants(**{n: f"{MUTANTS[n].effect} (needs {MUTANTS[n].needs})" for n in names})


@contextmanager
def with_planted(cell: Any) -> Iterator[None]:
    """Plant ``cell.mutant`` (a suite mutant, or None) in the suite for the block.

    Everything a case does runs inside, including building the CP view of its inputs:
    a bug in the distributor must reach the inputs too.
    """
    with planted(cell.mutant):
        yield


def _placements(codes: Sequence[Any]) -> list[Placement]:
    out: list[Placement] = []
    for p in codes:
        if isinstance(p, Placement):
            out.append(p)
        elif p == "R":
            out.append(Replicate())
        elif isinstance(p, str) and p.startswith("S") and p[1:].isdigit():
            out.append(Shard(int(p[1:])))
        else:
            raise ValueError(f"placement {p!r}: use a Placement, 'S<dim>' or 'R'")
    return out


class SuiteFeatureBatch(FeatureBatch):
    """A :class:`~cpmatrix.parity.FeatureBatch` whose activations are cut by the suite.

    ``check_parity`` lays out an input with symbolic axes through ``batch.distribute``;
    here that is :func:`cpmatrix.suite.pad_and_shard` with every ``"N"`` dim padded to the
    layout's size, so inputs and features of a case share one distributor.
    """

    __slots__ = ()

    def distribute(
        self,
        value: torch.Tensor,
        placements: Sequence[Any],
        axes: Sequence[str | int | None],
        *,
        pad: float = 0,
        requires_grad: bool = False,
    ) -> Any:
        if value.ndim != len(axes):
            raise ValueError(f"tensor of shape {tuple(value.shape)} but axes {tuple(axes)}")
        pad_to = {d: self.layout.axes[a].padded for d, a in enumerate(axes) if isinstance(a, str)}
        # a sharded dim without a named axis could not be mapped back: refuse to pad it
        out = pad_and_shard(value, self.mesh, _placements(placements), pad_to_divisible=False,
                         pad_to=pad_to, pad_value=pad)
        return out.requires_grad_(True) if requires_grad else out


def _layout(features: Mapping[str, torch.Tensor], mesh: Any) -> Layout:
    layout = compute_layout({k: v.cpu() for k, v in features.items()}, mesh.size())
    tokens = layout.axes["N"]
    want = padded_size(tokens.size, mesh.size(0) * mesh.size(1))
    if tokens.padded != want:  # the toolkit and the suite must agree on the padding
        raise AssertionError(f"toolkit pads N={tokens.size} to {tokens.padded}, "
                             f"the suite to {want}")
    return layout


def feature_batch(serial: dict[str, torch.Tensor], cp: dict[str, Any], layout: Layout,
                  mesh: Any) -> SuiteFeatureBatch:
    """Assemble a :class:`SuiteFeatureBatch` (what the views below return)."""
    sizes = {a: lay.size for a, lay in layout.axes.items()}
    return SuiteFeatureBatch(serial, cp, layout, mesh, sizes)


def _kept(features: Mapping[str, torch.Tensor], keep: Sequence[str] | None) -> list[str]:
    return [k for k in features if keep is None or k in keep]


def layout_view(features: Mapping[str, torch.Tensor], mesh: Any, *,
                keep: Sequence[str] | None = None) -> FeatureBatch:
    """No features: only the sample's layout, for cases whose inputs are all activations.

    Use with ``feature_subset=()``; features asked for anyway are refused (they would be
    handed out without a placement).
    """
    names = _kept(features, keep)
    if names:
        raise ValueError(f"layout_view hands out no features, got {names}; use seq_view, "
                         "pair_view or model_view")
    return feature_batch({}, {}, _layout(features, mesh), mesh)


def seq_view(features: Mapping[str, torch.Tensor], mesh: Any, *,
             keep: Sequence[str] | None = None) -> FeatureBatch:
    """Token features over the flattened mesh (rank ``(r, c)`` holds block ``r * C + c``).

    That is how the suite's sequence track is laid out (ring attention, ``CPAttention``);
    the toolkit's generic contract shards them over cp0 only. Padded tokens get the
    feature's pad value (False for ``token_mask``, so ring attention masks them).
    """
    layout = _layout(features, mesh)
    npad = layout.axes["N"].padded
    serial, cp = {}, {}
    for name in _kept(features, keep):
        spec = SPECS[name]
        if spec.axes[0] != "N" or "N" in spec.axes[1:] or spec.index_of is not None:
            raise ValueError(f"seq_view lays out per-token features; {name} has axes {spec.axes}")
        serial[name] = features[name]
        cp[name] = pad_and_shard(features[name], mesh, seq_placements(0), pad_to={0: npad},
                              pad_value=spec.pad)
    return feature_batch(serial, cp, layout, mesh)


def _pair_mask(token_mask: torch.Tensor) -> torch.Tensor:
    return token_mask[:, None] & token_mask[None, :]


def pair_view(features: Mapping[str, torch.Tensor], mesh: Any, *,
              keep: Sequence[str] | None = None) -> FeatureBatch:
    """Pair features 2-D sharded (rows over cp0, columns over cp1); ``token_mask`` becomes
    the pair mask ``m_i & m_j`` (named ``pair_mask``), which is what pair ops consume."""
    layout = _layout(features, mesh)
    npad = layout.axes["N"].padded
    serial, cp = {}, {}
    for name in _kept(features, keep):
        spec = SPECS[name]
        if name == "token_mask":
            full, out, channels = _pair_mask(features[name]), "pair_mask", False
        elif spec.axes[:2] == ("N", "N") and "N" not in spec.axes[2:]:
            full, out, channels = features[name], name, len(spec.axes) == 3
        else:
            raise ValueError(f"pair_view lays out pair features and token_mask; {name} has "
                             f"axes {spec.axes}")
        serial[out] = full
        cp[out] = pad_and_shard(full, mesh, pair_placements(full.ndim, channels_last=channels),
                             pad_to={0: npad, 1: npad}, pad_value=spec.pad)
    return feature_batch(serial, cp, layout, mesh)


def model_view(features: Mapping[str, torch.Tensor], mesh: Any, *,
               keep: Sequence[str] | None = None) -> FeatureBatch:
    """The small model's batch, cut by its production distributor ``distribute_batch``.

    The collate maps features to the model's inputs and targets: ``token_feats`` and
    ``pair_feats`` are its inputs, ``token_mask`` its mask; it learns to predict the
    residue type (``restype``, scaled to [0, 1]) per token and the clipped relative
    position (``rel_pos``, scaled to [-1, 1]) per pair, so the targets are features too.
    ``keep`` must be None: the model consumes that fixed set.
    """
    if keep is not None:
        raise ValueError("model_view builds the model's whole batch; pass no feature_subset")
    layout = _layout(features, mesh)
    dtype = features["token_feats"].dtype
    rel_mid = (SPECS["rel_pos"].high or 2) / 2
    mask = features["token_mask"]
    batch = Batch(
        seq=features["token_feats"],
        pair=features["pair_feats"],
        mask=mask,
        pair_mask=_pair_mask(mask),
        target_seq=features["restype"].to(dtype) / float(SPECS["restype"].high or 1),
        target_pair=(features["rel_pos"].to(dtype) - rel_mid) / rel_mid,
    )
    cp_batch = distribute_batch(batch, mesh)
    names = [f.name for f in dataclasses.fields(Batch)]
    return feature_batch({n: getattr(batch, n) for n in names},
                         {n: getattr(cp_batch, n) for n in names}, layout, mesh)


def data_module(cell: Any, distributor: Any, *, n_tokens: int,
                feature_subset: Sequence[str] | None = None,
                need_masked_token: bool = False, samples: int = 64) -> FeatureBatch:
    """The cell's sample from the shared DataModule, through ``distributor``.

    ``need_masked_token``: take the first of ``samples`` samples whose ``token_mask`` masks
    at least one token, so the mask path is exercised even where no padding exists (a 1x1
    mesh); every rank picks the same one (the data is deterministic from ``cell.seed``).
    """
    dm = SyntheticDataModule.for_cell(cell, n_tokens=n_tokens, n_samples=samples,
                                      distributor=distributor, feature_subset=feature_subset)
    if not need_masked_token:
        return dm.batch(cell.mesh)
    for index in range(samples):
        if not bool(dm.dataset.full_item(index)["token_mask"].all()):
            cell.record("data.sample", index)
            return dm.batch(cell.mesh, index)
    raise VacuousError(Check.NONZERO, f"none of {samples} synthetic samples masks a token: the "
                       "mask path would not be exercised")


def local(value: Any) -> torch.Tensor:
    """This rank's shard of a DTensor (a plain tensor is returned as is)."""
    return value.to_local() if isinstance(value, DTensor) else value


def mesh_label(cell: Any) -> str:
    """``"2x3"``: the mesh shape as in cell ids."""
    return "x".join(str(int(s)) for s in cell.mesh.shape)
