"""Layer cases: the sharded LayerNorm and the ring-attention layer vs their serial twins.

Both compare output, input grad and the grad of every parameter by name (the replicated
parameters' grads must be all-reduced over the sharded axes: mutant ``no_grad_allreduce``).
``cell.path == "kernel"`` runs the CP side on the Triton kernels (LayerNorm forward and
backward; softmax and the online-softmax merge in attention) against torch on the serial
side, so the kernels are checked at the same time.

The attention layer's output projection starts at zero (AlphaFold's init). The toolkit
perturbs it before taking the state_dict; the case asserts it did, because with ``o == 0``
the output and every upstream gradient would be zero on both sides and pass vacuously.

Example (a matrix target)::

    - name: layernorm
      case: "cpmatrix.suite.cases.layer:layernorm"
      level: layer
      axes: {mesh: [1x2, 2x3], dtype: [fp64, fp32], path: [reference, kernel]}
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from cpmatrix.parity import Check, TensorSpec, VacuousError, check_parity
from cpmatrix.suite import pair_placements, seq_placements
from cpmatrix.suite.cases.common import (
    data_module,
    layout_view,
    seq_view,
    suite_mutants,
    with_planted,
)
from cpmatrix.suite.ops.attention_layer import Attention, CPAttention
from cpmatrix.suite.ops.layernorm import LayerNorm, ShardedLayerNorm

__all__ = ["AttentionOnTokens", "Normalized", "attention_layer", "attention_layer_single",
           "layernorm"]

#: Pair channels of the LayerNorm case; width, heads and head width of the attention layer.
PAIR_CHANNELS = 8
DIM, HEADS, HEAD_DIM = 8, 2, 4


def _n(cell: Any, default: int = 7) -> int:
    return int(cell.params.get("n", default))


class Normalized(nn.Module):
    """``check_parity`` calls ``fn(**inputs)``: this takes the layout batch and ``z``.

    The same wrapper holds the serial and the CP LayerNorm, so their state_dicts match.
    """

    def __init__(self, norm: LayerNorm) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, feats: Any, z: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(z)
        return out


@suite_mutants("no_grad_allreduce", "shard_offset_off_by_one")
def layernorm(cell: Any) -> None:
    """LayerNorm over a 2-D sharded pair tensor ``(N, N, c)`` vs ``LayerNorm``.

    On a 1x1 mesh it is the serial layer itself (no collective, no shard): the matrix
    runs it on meshes with an axis > 1 only.
    """
    with with_planted(cell):
        batch = data_module(cell, layout_view, n_tokens=_n(cell), feature_subset=())
        check_parity(
            cell,
            Normalized(LayerNorm(PAIR_CHANNELS)),
            Normalized(ShardedLayerNorm(PAIR_CHANNELS, cell.mesh, path=cell.path)),
            inputs={"feats": batch, "z": TensorSpec(shape=("N", "N", PAIR_CHANNELS))},
            placements={"z": pair_placements(3)}, output_axes=("N", "N", None),
            label="layernorm")


class AttentionOnTokens(nn.Module):
    """Self-attention over tokens with the DataModule's ``token_mask`` as key mask."""

    def __init__(self, attn: Attention) -> None:
        super().__init__()
        self.attn = attn

    def forward(self, feats: Any, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.attn(x, feats["token_mask"])
        return out


def _attention_layer(cell: Any) -> None:
    with with_planted(cell):
        batch = data_module(cell, seq_view, n_tokens=_n(cell), feature_subset=("token_mask",),
                            need_masked_token=True)
        report = check_parity(
            cell,
            AttentionOnTokens(Attention(DIM, HEADS, HEAD_DIM)),
            AttentionOnTokens(CPAttention(DIM, HEADS, HEAD_DIM, cell.mesh, path=cell.path)),
            inputs={"feats": batch, "x": TensorSpec(shape=("N", DIM))},
            placements={"x": seq_placements(0)}, output_axes=("N", None),
            label="attention")
    # the zero-initialized output projection must have been perturbed (else 0 == 0)
    if not {"attn.o.weight", "attn.o.bias"} <= set(report.perturbed):
        raise VacuousError(Check.NONZERO, f"the zero-init output projection was not perturbed: "
                           f"perturbed {report.perturbed}")
    cell.record("attention.perturbed", ", ".join(report.perturbed))


@suite_mutants("no_grad_allreduce", "pad_mask_off")
def attention_layer(cell: Any) -> None:
    """Projections, ring attention over the flattened mesh, zero-init output projection."""
    if cell.mesh.size() < 2:
        raise ValueError("attention_layer needs > 1 rank; use attention_layer_single on 1x1")
    _attention_layer(cell)


@suite_mutants("pad_mask_off")
def attention_layer_single(cell: Any) -> None:
    """The attention layer on one rank (1x1): the layer math and the key mask."""
    _attention_layer(cell)
