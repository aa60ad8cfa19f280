"""Recipe: torch's own context parallel (ring attention inside SDPA), cuda platform only.

``torch.distributed.tensor.experimental.context_parallel(mesh, buffers=..., buffer_seq_dims=...)``
shards the given buffers along their sequence dim *in place* on entry (restoring them on
exit) and, while it is active, runs every ``F.scaled_dot_product_attention`` as ring
attention over ``mesh``. Forward and backward must both run inside it, which is what
``check_parity(..., context=...)`` does: here the factory takes the CP side's inputs (the
buffers to shard are the step's own input tensors).

**It does not run on CPU** in torch 2.13: no DTensor sharding rule exists for the CPU
flash kernel (``aten._scaled_dot_product_flash_attention_for_cpu``), the MATH backend
mixes ``Tensor`` and ``DTensor``, and flex_attention has no CPU backward. The target is on
the ``cuda`` platform only (``matrix/recipes.yaml``); on a CPU host plan it with
``cpmatrix run --matrix matrix/recipes.yaml --platform cuda -k context_parallel --dry-run
--gpus 2``. The CPU recipes show the same check on hand-written sequence parallel
attention (``ulysses.py``).

The sequence length is ``3 x`` the ``cp1`` size, never a multiple of ``2 x`` it, so torch
applies no load balancing (its head-tail reordering needs a multiple): each rank holds one
contiguous chunk, and the CP output is a DTensor sharded on the sequence over ``cp1``.

Planted bug (``cpmatrix run --mutants``):

- ``position_buffer_not_sharded``: the model's absolute position embedding (a buffer over
  the sequence) is left out of ``buffers``: each rank adds the positions of the first chunk
  to its own chunk: killed by ``output``.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from cpmatrix.parity import TensorSpec, check_parity, mutant_on, mutants

__all__ = ["Attention", "ContextParallelAttention", "torch_context_parallel"]


class Attention(nn.Module):
    """Causal multi-head self-attention with a learned absolute position table."""

    def __init__(self, dim: int = 16, heads: int = 4, max_seq: int = 64) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.register_buffer("positions", torch.randn(1, max_seq, dim) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        positions: torch.Tensor = self.positions  # type: ignore[assignment]
        h = x + positions[:, :s]
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(h).chunk(3, dim=-1))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.out(o.transpose(1, 2).reshape(b, s, d))
        return out


class ContextParallelAttention(Attention):
    """The same module on this rank's chunk of the sequence (``context_parallel`` sharded
    the input, and the position table, in place); the output back as a DTensor."""

    def __init__(self, mesh: Any, dim: int = 16, heads: int = 4, max_seq: int = 64) -> None:
        super().__init__(dim, heads, max_seq)
        self.mesh = mesh

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        shape = torch.Size((x.shape[0], x.shape[1] * self.mesh.size(), y.shape[-1]))
        return DTensor.from_local(y, self.mesh, [Shard(1)], shape=shape,
                                  stride=torch.empty(shape, device="meta").stride())


@mutants(position_buffer_not_sharded="the position table is left out of the buffers")
def torch_context_parallel(cell: Any) -> None:
    from torch.distributed.tensor.experimental import context_parallel

    torch.manual_seed(cell.seed)
    mesh = cell.mesh["cp1"]
    seq = 3 * mesh.size()
    serial, cp = Attention(max_seq=seq), ContextParallelAttention(mesh, max_seq=seq)

    def shard_the_step(inputs: Mapping[str, Any]) -> AbstractContextManager[Any]:
        # every tensor over the sequence: the step's input and the position table (both
        # sharded in place on entry, restored on exit)
        buffers: list[torch.Tensor] = [inputs["x"], cp.positions]  # type: ignore[list-item]
        if mutant_on(cell, "position_buffer_not_sharded"):
            buffers = buffers[:1]
        return context_parallel(mesh, buffers=buffers, buffer_seq_dims=[1] * len(buffers))

    check_parity(
        cell, serial, cp,
        inputs={"x": TensorSpec(shape=(2, seq, 16), requires_grad=False)},
        placements={"x": None},  # full sequence in; context_parallel shards it in place
        context=shard_the_step,
    )
