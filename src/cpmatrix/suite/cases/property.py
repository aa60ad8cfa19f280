"""Property case: the RNG entropy of diffusion noise drawn under CP.

Random draws have no serial value oracle (no distributed RNG reproduces a single-device
draw), so what is checked is their *structure*, with the toolkit's
:class:`~cpmatrix.parity.RngRecorder` and :func:`~cpmatrix.parity.assert_entropy`:

* the coordinate noise ``eps`` of a sampler step has the shape of this rank's shard of
  ``atom_coords`` (atoms sharded over cp0, replicated over cp1, as the DataModule's
  contract places them): ranks on different cp0 shards must draw independent streams (no
  tiling), ranks that differ only in cp1 identical ones;
* the random augmentation (a rotation quaternion and a translation per sample) is one
  draw for the whole structure: identical on every rank.

:func:`sampler_noise` is the code under test: one generator per shard, seeded from the
cell's seed, the stream and the shard index over the sharded axes only. Its planted bugs
(``tiled_seed``: the shard index left out; ``rank_seed``: the global rank used instead)
are the two classic ways to get CP noise wrong.

Example (a matrix target; cp0 must be > 1 for the tiling bug to be visible)::

    - name: diffusion_noise
      case: "cpmatrix.suite.cases.property:diffusion_noise"
      level: unit
      kind: property
      axes: {mesh: [2x1, 2x2], dtype: [fp64]}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from cpmatrix.parity import (
    RngRecorder,
    SyntheticDataModule,
    assert_entropy,
    mutant_on,
    mutants,
    storage_dtype,
)
from cpmatrix.suite.cases.common import local

__all__ = ["diffusion_noise", "noisy_coordinates", "sampler_noise"]

#: Samples drawn per structure (the diffusion "multiplicity").
MULTIPLICITY = 4
#: Smallest draw that counts for the exercise threshold (a scalar draw proves nothing).
MIN_NUMEL = 64
_STREAM_NOISE, _STREAM_AUGMENT = 1, 2


def sampler_noise(cell: Any, shape: Sequence[int], *, shard_axes: Sequence[str],
                  stream: int) -> torch.Tensor:
    """Standard normal noise for this rank's shard, drawn on ``cell.device``.

    The generator is seeded from ``(cell.seed, stream, shard index over shard_axes)``:
    ranks on different shards draw independent streams, ranks that hold the same shard
    (they differ only on the other, replicated axes) draw the same numbers without any
    communication. ``shard_axes=()`` is one draw for everyone (replicated).

    Example: ``eps = sampler_noise(cell, (4, 12, 3), shard_axes=("cp0",), stream=1)``.
    """
    mesh = cell.mesh
    names = list(mesh.mesh_dim_names)
    coord = mesh.get_coordinate()
    shard = 0
    for axis in shard_axes:
        dim = names.index(axis)
        shard = shard * mesh.size(dim) + coord[dim]
    if mutant_on(cell, "tiled_seed"):
        shard = 0  # the bug: every shard draws the first shard's numbers
    elif mutant_on(cell, "rank_seed"):
        shard = cell.rank  # the bug: replicas of one shard draw different numbers
    seed = (cell.seed * 1_000_003 + stream * 10_007 + shard) % (2**63)
    gen = torch.Generator(device=cell.device).manual_seed(seed)
    return torch.randn(tuple(shape), generator=gen, device=cell.device,
                       dtype=storage_dtype(cell))


def _rotation(q: torch.Tensor) -> torch.Tensor:
    """Rotation matrices ``(M, 3, 3)`` from quaternions ``(M, 4)`` (normalized here)."""
    w, x, y, z = (q / q.norm(dim=-1, keepdim=True)).unbind(-1)
    return torch.stack([
        torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
        torch.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
        torch.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
    ], -2)


def noisy_coordinates(cell: Any, coords: torch.Tensor, sigma: float,
                      recorder: RngRecorder) -> torch.Tensor:
    """One sampler step's input: ``augment(x) + sigma * eps`` for this rank's atoms.

    ``coords`` is this rank's shard ``(A_local, 3)``; the result is ``(MULTIPLICITY,
    A_local, 3)``. Draws are labelled ``augment`` and ``coord_noise`` for the recorder.
    """
    with recorder.scope("augment"):
        quat = sampler_noise(cell, (MULTIPLICITY, 4), shard_axes=(), stream=_STREAM_AUGMENT)
        shift = sampler_noise(cell, (MULTIPLICITY, 3), shard_axes=(), stream=_STREAM_AUGMENT + 1)
    with recorder.scope("coord_noise"):
        eps = sampler_noise(cell, (MULTIPLICITY, *coords.shape), shard_axes=("cp0",),
                            stream=_STREAM_NOISE)
    rotated = torch.einsum("mij,aj->mai", _rotation(quat), coords) + shift[:, None, :]
    return rotated + sigma * eps


@mutants(tiled_seed="every cp0 shard seeds its noise generator alike: the coordinate noise "
                    "is the same numbers tiled over the shards (needs cp0 > 1)",
         rank_seed="noise generators are seeded by global rank: ranks holding the same shard "
                   "(and every rank for the augmentation) draw different numbers")
def diffusion_noise(cell: Any) -> None:
    """Sharded coordinate noise independent over cp0, identical over cp1; augmentation
    identical everywhere; every rank drew enough to count (exercise threshold)."""
    if cell.mesh.size(0) < 2:
        raise ValueError("diffusion_noise needs cp0 > 1: the noise is sharded over cp0")
    batch = SyntheticDataModule.for_cell(cell, n_tokens=int(cell.params.get("n", 12)),
                                         feature_subset=("atom_coords",)).batch(cell.mesh)
    coords = local(batch.cp["atom_coords"])
    with RngRecorder(cell) as rec:
        x = noisy_coordinates(cell, coords, sigma=1.5, recorder=rec)
    rec.save()  # cell.out_dir/rng_fingerprints.rank<r>.json: re-checkable after the join
    if not bool(torch.isfinite(x).all()):
        raise AssertionError("noisy coordinates are not finite")
    prints = rec.gather()
    noise = assert_entropy(prints, sharded=("cp0",), replicated=("cp1",),
                           labels=("coord_noise",), min_numel=MIN_NUMEL)
    augment = assert_entropy(prints, sharded=(), replicated=("cp0", "cp1"),
                             labels=("augment",), min_numel=4 * MULTIPLICITY)
    cell.record("rng.local_atoms", int(coords.shape[0]))
    for name, report in (("coord_noise", noise), ("augment", augment)):
        cell.record(f"rng.{name}", "; ".join(report.lines))
