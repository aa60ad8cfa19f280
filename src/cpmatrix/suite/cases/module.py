"""Module case: the pair block on a 2-D sharded ``N x N x c`` tensor, fed by the DataModule.

The block is triangle multiplicative update (outgoing, then incoming) and pair-biased row
attention, each with a residual. Its inputs come from the toolkit's shared
:class:`~cpmatrix.parity.SyntheticDataModule`, cut by the suite's distributor
(:func:`~cpmatrix.suite.cases.common.pair_view`): ``pair_feats`` (embedded and added to an
upstream pair activation ``z``) and the pair mask ``token_mask_i & token_mask_j``. ``n``
does not divide the mesh in most cells, so padded rows and columns (mask False) travel
through every gather, transpose and ring step.

Example (a matrix target)::

    - name: pair_block
      case: "cpmatrix.suite.cases.module:pair_block"
      level: module
      axes: {mesh: [1x2, 2x3], dtype: [fp64]}
      params: {n: [7]}
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from cpmatrix.parity import FEATURES, TensorSpec, check_parity
from cpmatrix.suite import from_local, pair_placements
from cpmatrix.suite.cases.common import (
    data_module,
    local,
    pair_view,
    suite_mutants,
    with_planted,
)
from cpmatrix.suite.ops.common import PAIR_AXES, replicated_linear
from cpmatrix.suite.ops.pair_block import CPPairBlock, PairBlock

__all__ = ["CPPairStack", "PairStack", "pair_block", "pair_block_single"]

#: Pair width, triangle hidden width, pair-attention heads and head width. The triangle's
#: output LayerNorm normalizes HIDDEN channels: with 4 of them some positions have a tiny
#: variance, whose 1/std amplifies fp32 rounding past the table's fp32 row (~3e-5 seen);
#: 16 keeps the block as well conditioned as a real one (AlphaFold uses 128).
CHANNELS, HIDDEN, HEADS, HEAD_DIM = 6, 16, 2, 3
#: Channels of the ``pair_feats`` feature (from the toolkit's contract).
PAIR_FEATS = int(next(s for s in FEATURES if s.name == "pair_feats").axes[2])


class PairStack(nn.Module):
    """Serial: ``PairBlock(z + pair_embed(pair_feats), pair_mask)``."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.pair_embed = nn.Linear(PAIR_FEATS, CHANNELS)
        self.block = block

    def forward(self, feats: Any, z: torch.Tensor) -> torch.Tensor:
        z0 = z + self.pair_embed(feats["pair_feats"])
        out: torch.Tensor = self.block(z0, feats["pair_mask"])
        return out


class CPPairStack(PairStack):
    """CP twin: the same on this rank's block; ``pair_embed``'s grads all-reduced."""

    block: CPPairBlock

    def forward(self, feats: Any, z: DTensor) -> DTensor:  # type: ignore[override]
        mesh = z.device_mesh
        emb = replicated_linear(local(feats["pair_feats"]), self.pair_embed, mesh, PAIR_AXES)
        out = self.block.forward_local(z.to_local() + emb, local(feats["pair_mask"]))
        return from_local(out, mesh, z.placements, z.shape)


def _pair_block(cell: Any) -> None:
    with with_planted(cell):
        batch = data_module(cell, pair_view, n_tokens=int(cell.params.get("n", 7)),
                            feature_subset=("pair_feats", "token_mask"), need_masked_token=True)
        check_parity(
            cell,
            PairStack(PairBlock(CHANNELS, HIDDEN, HEADS, HEAD_DIM)),
            CPPairStack(CPPairBlock(CHANNELS, HIDDEN, HEADS, HEAD_DIM, cell.mesh,
                                    path=cell.path)),
            inputs={"feats": batch, "z": TensorSpec(shape=("N", "N", CHANNELS))},
            placements={"z": pair_placements(3)}, output_axes=("N", "N", None),
            label="pair_block")
    block = local(batch.cp["pair_mask"]).shape
    cell.record("pair_block.local_block", "x".join(str(s) for s in block))


@suite_mutants("tri_mask_off", "allgather_bwd_no_reduce", "no_grad_allreduce")
def pair_block(cell: Any) -> None:
    """Pair block on a mesh with an axis > 1 (gathers, transposes, ring along cp1)."""
    if cell.mesh.size() < 2:
        raise ValueError("pair_block needs > 1 rank; use pair_block_single on 1x1")
    _pair_block(cell)


@suite_mutants("tri_mask_off", "transpose_view_not_permute")
def pair_block_single(cell: Any) -> None:
    """Pair block on one rank (1x1): the math, the masks and the (local) transpose."""
    _pair_block(cell)
