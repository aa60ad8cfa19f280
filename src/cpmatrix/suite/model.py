"""A small model built from the suite's layers, its CP twin, and a training step for both.

::

    s = embed(seq)                          (N, d_s)        sequence track
    s = s + Attention(LayerNorm(s), mask)                    ring attention in CP
    z = pair_in(pair) + left(s)_i + right(s)_j               (N, N, c_z) outer sum
    z = PairBlock(z, mask_i * mask_j)                        triangle updates + pair attention
    loss = masked MSE(head_s(s), target_seq) + masked MSE(head_z(z), target_pair)

CP layout: the sequence track is sharded over the flattened mesh
(:func:`~cpmatrix.suite.distribute.seq_placements`), the pair track rows over cp0 and
columns over cp1; both are padded to the same ``Np`` (a multiple of ``R * C``). With
that ``Np`` the rows ``I_r`` of the pair layout are exactly the sequence blocks of mesh
row ``r``, so ``s[I_r]`` is an all-gather along cp1; ``s[J_c]`` is cut (with
:func:`~cpmatrix.suite.distribute.shard_range`) from the fully gathered ``s``. The loss
is a sum of local masked sums, all-reduced with a pass-through backward
(:func:`~cpmatrix.suite.ops.collectives.all_reduce_sum`; mutant ``loss_double_count``).

:class:`SmallModel` and :class:`CPSmallModel` have identical state_dicts; every CP
parameter gradient is all-reduced where it is used, so after ``backward`` all ranks hold
the full gradient and any optimizer steps them identically.

Example::

    cfg = ModelConfig()
    serial = SmallModel(cfg).double()
    cp = CPSmallModel(cfg, mesh).double()
    cp.load_state_dict(serial.state_dict())
    batch = make_batch(7, cfg, generator=g, dtype=torch.float64)
    loss_s = train_step(serial, batch, torch.optim.SGD(serial.parameters(), lr=0.1))
    loss_c = train_step(cp, distribute_batch(batch, mesh), torch.optim.SGD(cp.parameters(), lr=0.1))
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from cpmatrix.suite.distribute import (
    pad_and_shard,
    padded_size,
    pair_placements,
    seq_placements,
    shard_range,
)
from cpmatrix.suite.ops.attention_layer import Attention, CPAttention
from cpmatrix.suite.ops.collectives import Ring, all_gather, all_reduce_sum
from cpmatrix.suite.ops.common import PAIR_AXES, check_path, replicated_linear
from cpmatrix.suite.ops.layernorm import LayerNorm, ShardedLayerNorm
from cpmatrix.suite.ops.pair_block import CPPairBlock, PairBlock

__all__ = [
    "Batch",
    "CPSmallModel",
    "ModelConfig",
    "SmallModel",
    "distribute_batch",
    "make_batch",
    "train_step",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """Sizes of :class:`SmallModel` (small on purpose: parity runs in fp64 on CPU)."""

    #: per-residue input features, sequence width
    d_in: int = 6
    d_s: int = 8
    #: pair input features, pair width, triangle hidden width
    c_in: int = 4
    c_z: int = 8
    tri_hidden: int = 8
    #: attention heads and head width (sequence and pair attention)
    heads: int = 2
    head_dim: int = 4

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) < 1:
                raise ValueError(f"ModelConfig.{f.name} must be >= 1, got {getattr(self, f.name)}")


@dataclass(kw_only=True, slots=True)
class Batch:
    """Model inputs and targets: full tensors (serial) or DTensors (:func:`distribute_batch`)."""

    seq: torch.Tensor          #: (N, d_in)
    pair: torch.Tensor         #: (N, N, c_in)
    mask: torch.Tensor         #: (N,) bool
    pair_mask: torch.Tensor    #: (N, N) bool, mask_i & mask_j
    target_seq: torch.Tensor   #: (N,)
    target_pair: torch.Tensor  #: (N, N)


def make_batch(n: int, cfg: ModelConfig, *, generator: torch.Generator,
               dtype: torch.dtype = torch.float64, device: Any = "cpu",
               masked_fraction: float = 0.2) -> Batch:
    """Random features and targets for ``n`` residues, some of them masked.

    Draws only from ``generator``, so every rank builds the same batch. At least one
    residue stays unmasked.

    Example: ``make_batch(7, ModelConfig(), generator=torch.Generator().manual_seed(0))``.
    """
    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=dtype).to(device)

    mask = torch.rand(n, generator=generator) >= masked_fraction
    mask[0] = True
    mask = mask.to(device)
    return Batch(seq=randn(n, cfg.d_in), pair=randn(n, n, cfg.c_in), mask=mask,
                 pair_mask=mask[:, None] & mask[None, :], target_seq=randn(n),
                 target_pair=randn(n, n))


def distribute_batch(batch: Batch, mesh: Any) -> Batch:
    """Shard a full :class:`Batch` for :class:`CPSmallModel` (pads to a multiple of ``R * C``)."""
    n = batch.seq.shape[0]
    npad = padded_size(n, mesh.size(0) * mesh.size(1))
    seq_pl, pair_pl = seq_placements(0), pair_placements(2, channels_last=False)
    return Batch(
        seq=pad_and_shard(batch.seq, mesh, seq_pl, pad_to={0: npad}),
        pair=pad_and_shard(batch.pair, mesh, pair_placements(3), pad_to={0: npad, 1: npad}),
        mask=pad_and_shard(batch.mask, mesh, seq_pl, pad_to={0: npad}),
        pair_mask=pad_and_shard(batch.pair_mask, mesh, pair_pl, pad_to={0: npad, 1: npad}),
        target_seq=pad_and_shard(batch.target_seq, mesh, seq_pl, pad_to={0: npad}),
        target_pair=pad_and_shard(batch.target_pair, mesh, pair_pl, pad_to={0: npad, 1: npad}),
    )


class SmallModel(nn.Module):
    """The serial model; ``model(batch)`` returns the scalar loss."""

    def __init__(self, cfg: ModelConfig, *, path: str = "reference") -> None:
        super().__init__()
        self.cfg, self.path = cfg, check_path(path)
        self.embed = nn.Linear(cfg.d_in, cfg.d_s)
        self.ln_s = self._norm(cfg.d_s)
        self.attn = self._attention()
        self.left = nn.Linear(cfg.d_s, cfg.c_z)
        self.right = nn.Linear(cfg.d_s, cfg.c_z)
        self.pair_in = nn.Linear(cfg.c_in, cfg.c_z)
        self.block = self._block()
        self.head_s = nn.Linear(cfg.d_s, 1)
        self.head_z = nn.Linear(cfg.c_z, 1)

    def _norm(self, channels: int) -> LayerNorm:
        return LayerNorm(channels, path=self.path)

    def _attention(self) -> nn.Module:
        return Attention(self.cfg.d_s, self.cfg.heads, self.cfg.head_dim, path=self.path)

    def _block(self) -> nn.Module:
        c = self.cfg
        return PairBlock(c.c_z, c.tri_hidden, c.heads, c.head_dim, path=self.path)

    def forward(self, batch: Batch) -> torch.Tensor:
        s = self.embed(batch.seq)
        s = s + self.attn(self.ln_s(s), batch.mask)
        z = self.pair_in(batch.pair) + self.left(s)[:, None] + self.right(s)[None, :]
        pm = batch.pair_mask
        z = self.block(z, pm)
        err_s = (self.head_s(s)[..., 0] - batch.target_seq) ** 2
        err_z = (self.head_z(z)[..., 0] - batch.target_pair) ** 2
        ls = (err_s * batch.mask.to(err_s.dtype)).sum() / batch.mask.sum()
        lz = (err_z * pm.to(err_z.dtype)).sum() / pm.sum()
        loss: torch.Tensor = ls + lz
        return loss


class CPSmallModel(SmallModel):
    """The CP twin of :class:`SmallModel`: ``model(distribute_batch(batch, mesh))`` -> loss.

    The returned loss is a plain tensor, the same on every rank.
    """

    def __init__(self, cfg: ModelConfig, mesh: Any, *, path: str = "reference") -> None:
        self.mesh = mesh
        super().__init__(cfg, path=path)

    def _norm(self, channels: int) -> LayerNorm:
        return ShardedLayerNorm(channels, self.mesh, path=self.path)

    def _attention(self) -> nn.Module:
        c = self.cfg
        return CPAttention(c.d_s, c.heads, c.head_dim, self.mesh, path=self.path)

    def _block(self) -> nn.Module:
        c = self.cfg
        return CPPairBlock(c.c_z, c.tri_hidden, c.heads, c.head_dim, self.mesh, path=self.path)

    def _lin(self, x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
        return replicated_linear(x, layer, self.mesh, PAIR_AXES)

    def forward(self, batch: Batch) -> torch.Tensor:
        mesh = self.mesh
        seq, mask = batch.seq.to_local(), batch.mask.to_local()  # type: ignore[attr-defined]
        pm = batch.pair_mask.to_local()  # type: ignore[attr-defined]
        assert isinstance(self.ln_s, ShardedLayerNorm) and isinstance(self.attn, CPAttention)
        assert isinstance(self.block, CPPairBlock)
        s = self._lin(seq, self.embed)
        s = s + self.attn.forward_local(self.ln_s.forward_local(s), mask,
                                        Ring.along(mesh, PAIR_AXES), PAIR_AXES)
        # pair rows I_r = the sequence blocks of mesh row r (Np is a multiple of R*C)
        s_rows = all_gather(s, mesh, "cp1", dim=0)
        s_full = all_gather(s_rows, mesh, "cp0", dim=0)
        npad = s_full.shape[0]
        j0, j1 = shard_range(npad, mesh.size(1), mesh.get_local_rank("cp1"))
        s_cols = s_full[j0:j1]
        z = (self._lin(batch.pair.to_local(), self.pair_in)  # type: ignore[attr-defined]
             + self._lin(s_rows, self.left)[:, None] + self._lin(s_cols, self.right)[None, :])
        z = self.block.forward_local(z, pm)
        err_s = (self._lin(s, self.head_s)[..., 0] - batch.target_seq.to_local()) ** 2  # type: ignore[attr-defined]
        err_z = (self._lin(z, self.head_z)[..., 0] - batch.target_pair.to_local()) ** 2  # type: ignore[attr-defined]
        sums = torch.stack([(err_s * mask.to(err_s.dtype)).sum(),
                            (err_z * pm.to(err_z.dtype)).sum()])
        sums = all_reduce_sum(sums, mesh, PAIR_AXES)
        with torch.no_grad():
            counts = all_reduce_sum(torch.stack([mask.sum(), pm.sum()]).to(sums.dtype), mesh,
                                    PAIR_AXES)
        return sums[0] / counts[0] + sums[1] / counts[1]


def train_step(model: nn.Module, batch: Batch, optimizer: torch.optim.Optimizer, *,
               autocast_dtype: torch.dtype | None = None) -> float:
    """One step: forward (optionally under autocast), loss, backward, optimizer step.

    Works for :class:`SmallModel` on a full batch and :class:`CPSmallModel` on a
    distributed one. Returns the loss as a float (the same on every rank for CP).
    Compare CP and serial with a scale-sensitive optimizer such as SGD: Adam divides
    out a uniform gradient scale, which hides bugs like ``loss_double_count``.

    Example: ``loss = train_step(model, batch, torch.optim.SGD(model.parameters(), lr=0.1))``.
    """
    optimizer.zero_grad(set_to_none=True)
    device = next(model.parameters()).device
    ctx = (torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None
           else contextlib.nullcontext())
    with ctx:
        loss = model(batch)
    loss.backward()
    optimizer.step()
    return float(loss.detach())

