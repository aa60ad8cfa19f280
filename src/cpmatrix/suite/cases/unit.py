"""Unit cases: the suite's collectives, the pair transpose and ring attention vs serial.

Each case compares one CP op with the full-tensor expression it stands for, forward and
backward (``check_parity``: random grad_output, every input grad), on inputs cut by the
suite's distributor (:mod:`.common`), with padding wherever ``n`` does not divide.

Mutants are declared per case function and must be observable on *every* cell that runs
it (``cpmatrix run --mutants`` runs each cell once per mutant). A bug that needs more than
one rank cannot be seen on a 1x1 mesh, so the ops that also run there have a second case
function (``*_single``) declaring only the bugs a single rank shows.

Example (a matrix target)::

    - name: ring_attention
      case: "cpmatrix.suite.cases.unit:ring_attention_case"
      level: unit
      axes: {mesh: [1x2, 2x2], dtype: [fp64]}
      params: {n: [7]}
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard

from cpmatrix.parity import Check, TensorSpec, VacuousError, check_parity
from cpmatrix.suite import from_local, pair_placements, seq_placements
from cpmatrix.suite.cases.common import (
    data_module,
    layout_view,
    local,
    seq_view,
    suite_mutants,
    with_planted,
)
from cpmatrix.suite.ops.collectives import all_gather, reduce_scatter, transpose_pair
from cpmatrix.suite.ops.ring_attention import attention_serial, ring_attention

__all__ = [
    "collectives",
    "pair_transpose",
    "ring_attention_case",
    "ring_attention_single",
]

#: Channels of the activations (small: fp64 parity on CPU).
CHANNELS = 3
#: Ring attention: heads, head width, value width (!= head width: catches a swapped q/v).
HEADS, HEAD_DIM, VALUE_DIM = 2, 4, 5


def _n(cell: Any, default: int = 7) -> int:
    return int(cell.params.get("n", default))


# ----------------------------------------------------------------------------- collectives

def _along(axis: str) -> list[Placement]:
    """Shard dim 0 over ``axis`` only (replicated over the other mesh axis)."""
    return [Shard(0), Replicate()] if axis == "cp0" else [Replicate(), Shard(0)]


def _gather_scale_serial(feats: Any, x: torch.Tensor) -> torch.Tensor:
    """``y_i = x_i * sum_k x_k``: every row needs every other row (an all-gather in CP)."""
    return x * x.sum(0, keepdim=True)


def _gather_scale_cp(axis: str) -> Any:
    def run(feats: Any, x: DTensor) -> DTensor:
        mesh, xl = x.device_mesh, x.to_local()
        full = all_gather(xl, mesh, axis, dim=0)       # every row of x along ``axis``
        # each rank uses the gathered copy with its own rows: backward must sum (reduce-
        # scatter) what every rank did with it
        return from_local(xl * full.sum(0, keepdim=True), mesh, x.placements, x.shape)

    return run


def _column_sum_serial(feats: Any, z: torch.Tensor) -> torch.Tensor:
    """``y_j = sum_i z_ij``: a sum over a sharded dim (a reduce-scatter in CP)."""
    return z.sum(0)


def _column_sum_cp(axis: str) -> Any:
    def run(feats: Any, z: DTensor) -> DTensor:
        mesh = z.device_mesh
        partial = z.to_local().sum(0)                  # this rank's rows only, every column
        y = reduce_scatter(partial, mesh, axis, dim=0)  # summed over ``axis``, columns cut
        return from_local(y, mesh, _along(axis), (z.shape[1], z.shape[2]))

    return run


def _every_shard_real(cell: Any, axis: str, n: int, padded: int, parts: int) -> None:
    """A shard of padding only adds zeros to every sum: a collective that drops it (or
    forgets to sum at all) would still match. Refuse such sizes instead of passing."""
    shard = padded // parts
    if n <= padded - shard:
        raise VacuousError(Check.SETUP, f"n={n} padded to {padded} over {parts} shards of {shard}: "
                           "the last shard holds padding only, so the collectives' sums "
                           "cannot show a missing contribution; choose n > "
                           f"{padded - shard}")
    cell.record(f"collectives.{axis}.real_rows_in_last_shard", n - (padded - shard))


@suite_mutants("allgather_bwd_no_reduce", "reduce_scatter_no_sum")
def collectives(cell: Any) -> None:
    """All-gather and reduce-scatter along each mesh axis of size > 1 vs their serial sums.

    On a 1x1 mesh both are the identity (nothing to test): the case refuses it.
    """
    axes = [a for i, a in enumerate(("cp0", "cp1")) if cell.mesh.size(i) > 1]
    if not axes:
        raise ValueError("collectives need a mesh axis > 1: on 1x1 they are the identity")
    with with_planted(cell):
        batch = data_module(cell, layout_view, n_tokens=_n(cell), feature_subset=())
        for axis in axes:
            tokens = batch.layout.axes["N"]
            _every_shard_real(cell, axis, tokens.size, tokens.padded,
                              cell.mesh.size(("cp0", "cp1").index(axis)))
            check_parity(cell, _gather_scale_serial, _gather_scale_cp(axis),
                         inputs={"feats": batch, "x": TensorSpec(shape=("N", CHANNELS))},
                         placements={"x": _along(axis)}, output_axes=("N", None),
                         label=f"all_gather.{axis}")
            check_parity(cell, _column_sum_serial, _column_sum_cp(axis),
                         inputs={"feats": batch, "z": TensorSpec(shape=("N", "N", CHANNELS))},
                         placements={"z": _along(axis)}, output_axes=("N", None),
                         label=f"reduce_scatter.{axis}")


# ----------------------------------------------------------------------------- transpose

def _transpose_serial(feats: Any, z: torch.Tensor) -> torch.Tensor:
    return z.transpose(0, 1)


def _transpose_cp(feats: Any, z: DTensor) -> DTensor:
    w = transpose_pair(z.to_local(), z.device_mesh)
    return from_local(w, z.device_mesh, z.placements, z.shape)


@suite_mutants("transpose_view_not_permute")
def pair_transpose(cell: Any) -> None:
    """The pair transpose (rows over cp0, columns over cp1) vs ``z.transpose(0, 1)``.

    Any mesh, 1x1 included: the local block is transposed there too.
    """
    with with_planted(cell):
        batch = data_module(cell, layout_view, n_tokens=_n(cell), feature_subset=())
        check_parity(cell, _transpose_serial, _transpose_cp,
                     inputs={"feats": batch, "z": TensorSpec(shape=("N", "N", CHANNELS))},
                     placements={"z": pair_placements(3)}, output_axes=("N", "N", None),
                     label="transpose")


# ----------------------------------------------------------------------------- ring attention

def _attention_serial(feats: Any, q: torch.Tensor, k: torch.Tensor,
                      v: torch.Tensor) -> torch.Tensor:
    return attention_serial(q, k, v, key_mask=feats["token_mask"])


def _ring_cp(path: str) -> Any:
    def run(feats: Any, q: DTensor, k: DTensor, v: DTensor) -> DTensor:
        return ring_attention(q, k, v, key_mask=feats["token_mask"], path=path)

    return run


def _ring_attention(cell: Any) -> None:
    with with_planted(cell):
        # a masked token on every cell: pad_mask_off must be visible without padding too
        batch = data_module(cell, seq_view, n_tokens=_n(cell), feature_subset=("token_mask",),
                            need_masked_token=True)
        seq = seq_placements(1)
        check_parity(
            cell, _attention_serial, _ring_cp(cell.path),
            inputs={"feats": batch, "q": TensorSpec(shape=(HEADS, "N", HEAD_DIM)),
                    "k": TensorSpec(shape=(HEADS, "N", HEAD_DIM)),
                    "v": TensorSpec(shape=(HEADS, "N", VALUE_DIM))},
            placements={"q": seq, "k": seq, "v": seq}, output_axes=(None, "N", None),
            label="ring_attention")
    cell.record("ring_attention.ring_size", cell.mesh.size())
    cell.record("ring_attention.local_tokens", local(batch.cp["token_mask"]).shape[0])


@suite_mutants("ring_skip_last_step", "lse_merge_sign", "ring_no_dkv_return", "pad_mask_off")
def ring_attention_case(cell: Any) -> None:
    """Ring attention over the flattened mesh vs softmax attention, masked and padded keys.

    Needs a ring of more than one rank (the ring bugs need a second block); 1x1 cells use
    :func:`ring_attention_single`.
    """
    if cell.mesh.size() < 2:
        raise ValueError("ring_attention_case needs a ring of > 1 rank; use "
                         "ring_attention_single on 1x1")
    _ring_attention(cell)


@suite_mutants("pad_mask_off")
def ring_attention_single(cell: Any) -> None:
    """Ring attention on a ring of one (1x1): the block math and the key mask."""
    _ring_attention(cell)
