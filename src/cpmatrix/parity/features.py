"""The declared feature contract of the synthetic data: axes, features, placements.

Every feature has a name, symbolic axes (``"N"`` tokens, ``"A"`` atoms), a dtype kind,
placements over ("cp0", "cp1"), a value range, what it indexes and its pad value.
:func:`validate_features` checks a feature dict (synthetic or real) against it.

Example::

    >>> [s.name for s in FEATURES if s.index_of == "A"]
    ['token_to_rep_atom']
    >>> placements_of(("S0", "R"))
    [Shard(dim=0), Replicate()]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import torch

__all__ = [
    "AXES",
    "FEATURES",
    "N_RESTYPES",
    "PAIR_FEATS",
    "REL_CLIP",
    "TOKEN_FEATS",
    "AxisSpec",
    "FeatureSpec",
    "placements_of",
    "validate_features",
]

AxisName = str
#: A placement per mesh dim, in the compact form ``"S0"`` (Shard(0)), ``"S1"``, ``"R"``.
PlacementCode = str


@dataclass(frozen=True, slots=True)
class AxisSpec:
    """A symbolic axis. ``group_by`` names an index feature mapping each element of this
    axis to an element of its parent axis (atoms -> tokens): its shards follow the parent's."""

    name: AxisName
    doc: str
    group_by: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FeatureSpec:
    """One feature's contract: axes, dtype, placements over ("cp0", "cp1"), value semantics."""

    name: str
    #: Symbolic axis names or fixed sizes, e.g. ``("N", 8)``.
    axes: tuple[AxisName | int, ...]
    #: ``"float"`` (the cell's dtype), ``"int64"`` or ``"bool"``.
    kind: Literal["float", "int64", "bool"]
    #: Per mesh dim ("cp0", "cp1"): ``"S<d>"`` shards tensor dim d, ``"R"`` replicates.
    placements: tuple[PlacementCode, PlacementCode]
    #: Inclusive value range for ints (checked by :func:`validate_features`).
    low: int | None = None
    high: int | None = None
    #: The values index into this axis (remapped when that axis is re-laid out).
    index_of: AxisName | None = None
    monotone: Literal["strict", "nondecreasing"] | None = None
    #: Value in padded positions (masks: False; indices: the first index of the same shard).
    pad: float = 0
    doc: str = ""


#: The symbolic axes of the synthetic features.
AXES: Final[Mapping[str, AxisSpec]] = {
    "N": AxisSpec("N", "tokens; padded to a multiple of the world size"),
    "A": AxisSpec("A", "atoms, grouped per token; laid out per token shard", "atom_to_token"),
}

#: Relative positions are clipped to [-REL_CLIP, REL_CLIP] and shifted to [0, 2*REL_CLIP].
REL_CLIP: Final = 8
N_RESTYPES: Final = 20
TOKEN_FEATS: Final = 8
PAIR_FEATS: Final = 4

#: The declared feature contract (names, axes, dtypes, placements, masks, value ranges).
FEATURES: Final[tuple[FeatureSpec, ...]] = (
    FeatureSpec(
        name="token_index",
        axes=("N",),
        kind="int64",
        placements=("S0", "R"),
        low=0,
        monotone="strict",
        doc="residue index, strictly increasing (gaps allowed)",
    ),
    FeatureSpec(
        name="restype",
        axes=("N",),
        kind="int64",
        placements=("S0", "R"),
        low=0,
        high=N_RESTYPES - 1,
        doc="residue type",
    ),
    FeatureSpec(
        name="token_mask",
        axes=("N",),
        kind="bool",
        placements=("S0", "R"),
        pad=False,
        doc="valid tokens; padded tokens are False",
    ),
    FeatureSpec(
        name="token_feats",
        axes=("N", TOKEN_FEATS),
        kind="float",
        placements=("S0", "R"),
        doc="per-token input features",
    ),
    FeatureSpec(
        name="pair_feats",
        axes=("N", "N", PAIR_FEATS),
        kind="float",
        placements=("S0", "S1"),
        doc="pair features, 2-D sharded over (cp0, cp1)",
    ),
    FeatureSpec(
        name="rel_pos",
        axes=("N", "N"),
        kind="int64",
        placements=("S0", "S1"),
        low=0,
        high=2 * REL_CLIP,
        doc="clip(token_index[j] - token_index[i]) + REL_CLIP",
    ),
    FeatureSpec(
        name="atom_to_token",
        axes=("A",),
        kind="int64",
        placements=("S0", "R"),
        low=0,
        index_of="N",
        monotone="nondecreasing",
        doc="token of each atom",
    ),
    FeatureSpec(
        name="atom_coords",
        axes=("A", 3),
        kind="float",
        placements=("S0", "R"),
        doc="atom coordinates",
    ),
    FeatureSpec(
        name="atom_mask",
        axes=("A",),
        kind="bool",
        placements=("S0", "R"),
        pad=False,
        doc="resolved atoms; padded atoms are False",
    ),
    FeatureSpec(
        name="token_to_rep_atom",
        axes=("N",),
        kind="int64",
        placements=("S0", "R"),
        low=0,
        index_of="A",
        doc="representative atom of each token (an atom index)",
    ),
)

SPECS_BY_NAME: Final = {spec.name: spec for spec in FEATURES}


# --------------------------------------------------------------------------------------
# placements


def placements_of(codes: Sequence[PlacementCode]) -> list[Any]:
    """``("S0", "R")`` -> ``[Shard(0), Replicate()]``."""
    from torch.distributed.tensor import Replicate, Shard

    out: list[Any] = []
    for code in codes:
        if code == "R":
            out.append(Replicate())
        elif code.startswith("S") and code[1:].isdigit():
            out.append(Shard(int(code[1:])))
        else:
            raise ValueError(f"placement code {code!r}: use 'S<dim>' or 'R'")
    return out


def _check_rank(value: torch.Tensor, axes: Sequence[Any]) -> None:
    if value.ndim != len(axes):
        raise ValueError(f"tensor of shape {tuple(value.shape)} but {len(axes)} axes {tuple(axes)}")


def _axis_sizes(
    features: Mapping[str, torch.Tensor], specs: Mapping[str, FeatureSpec]
) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for name, value in features.items():
        spec = specs.get(name)
        if spec is None:
            continue
        _check_rank(value, spec.axes)
        for dim, axis in enumerate(spec.axes):
            if (
                isinstance(axis, str)
                and sizes.setdefault(axis, value.shape[dim]) != value.shape[dim]
            ):
                raise ValueError(
                    f"{name}: axis {axis!r} has size {value.shape[dim]}, other "
                    f"features say {sizes[axis]}"
                )
    return sizes


def validate_features(
    features: Mapping[str, torch.Tensor], *, specs: Iterable[FeatureSpec] = FEATURES
) -> list[str]:
    """Problems with ``features`` against the declared contract (empty list: valid).

    Checks dtypes, axis sizes agreeing across features, fixed sizes, value ranges,
    monotone indices, indices in range, and the coupling ``rel_pos`` <-> ``token_index``.
    Real data (a user's features) is validated the same way before a test uses it.
    """
    by_name = {s.name: s for s in specs}
    problems: list[str] = []
    try:
        sizes = _axis_sizes(features, by_name)
    except ValueError as exc:
        return [str(exc)]
    for name, value in features.items():
        spec = by_name.get(name)
        if spec is None:
            problems.append(f"{name}: not a declared feature")
            continue
        want = {"int64": torch.int64, "bool": torch.bool}.get(spec.kind)
        if (want is not None and value.dtype != want) or (
            want is None and not value.is_floating_point()
        ):
            problems.append(f"{name}: dtype {value.dtype}, declared {spec.kind}")
        for dim, axis in enumerate(spec.axes):
            if isinstance(axis, int) and value.shape[dim] != axis:
                problems.append(f"{name}: dim {dim} is {value.shape[dim]}, declared {axis}")
        if value.numel() == 0:
            continue
        if spec.low is not None and int(value.min()) < spec.low:
            problems.append(f"{name}: min {int(value.min())} < declared low {spec.low}")
        if spec.high is not None and int(value.max()) > spec.high:
            problems.append(f"{name}: max {int(value.max())} > declared high {spec.high}")
        if spec.index_of is not None and int(value.max()) >= sizes.get(spec.index_of, 0):
            problems.append(
                f"{name}: index {int(value.max())} out of range for axis "
                f"{spec.index_of!r} of size {sizes.get(spec.index_of, 0)}"
            )
        if spec.monotone is not None:
            step = value[1:] - value[:-1]
            if bool((step <= 0).any() if spec.monotone == "strict" else (step < 0).any()):
                problems.append(f"{name}: not {spec.monotone} monotone")
    if "rel_pos" in features and "token_index" in features:
        ti = features["token_index"]
        want_rel = (ti[None, :] - ti[:, None]).clamp(-REL_CLIP, REL_CLIP) + REL_CLIP
        if not torch.equal(features["rel_pos"], want_rel):
            problems.append("rel_pos: inconsistent with token_index")
    return problems
