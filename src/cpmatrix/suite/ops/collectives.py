"""Differentiable collectives for a 2-D ("cp0", "cp1") mesh.

Every function here works on this rank's *local* tensor (``DTensor.to_local()``) and
has an explicit backward, so gradients never depend on autograd tracing through
communication:

=====================  ==============================  ==================================
function               forward                         backward
=====================  ==============================  ==================================
:func:`all_gather`     all-gather along one mesh axis  reduce-scatter (sum) along it
:func:`reduce_scatter` reduce-scatter along one axis   all-gather along it
:func:`replicate_grad` identity (a replicated param)   all-reduce over the sharded axes
:func:`all_reduce_sum` all-reduce (sum)                identity
:func:`transpose_pair` pair block of ``z^T``           the same transpose (self-adjoint)
=====================  ==============================  ==================================

plus :class:`Ring` and :func:`ring_exchange`, the point-to-point shift ring attention is
built on. Collectives use the mesh's own process groups (gloo on CPU, nccl on CUDA);
point-to-point messages address global ranks.

Mutants (see :mod:`cpmatrix.suite.mutants`): ``allgather_bwd_no_reduce``,
``reduce_scatter_no_sum``, ``no_grad_allreduce``, ``loss_double_count``,
``transpose_view_not_permute``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from cpmatrix.suite._typing import apply_fn
from cpmatrix.suite.mutants import is_planted

__all__ = [
    "Ring",
    "all_gather",
    "all_reduce_sum",
    "axis_info",
    "reduce_scatter",
    "replicate_grad",
    "ring_exchange",
    "transpose_pair",
]

# torch 2.13 renamed the tensor-in/tensor-out collectives and deprecates the old names
# (a FutureWarning per call); older torch (the GPU machine has 2.11) only has the old ones.
_all_gather_1 = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_1 = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def axis_info(mesh: Any, axis: str) -> tuple[Any, int, int]:
    """``(group, size, index)`` of this rank along mesh dim ``axis``.

    ``index`` is the mesh coordinate, which is also the rank inside ``group`` (checked:
    the collectives below order blocks by group rank).
    """
    group = mesh.get_group(axis)
    size = mesh.size(mesh.mesh_dim_names.index(axis))
    index = mesh.get_local_rank(axis)
    if size > 1 and dist.get_rank(group) != index:
        raise RuntimeError(f"mesh axis {axis!r}: group rank {dist.get_rank(group)} != mesh "
                           f"coordinate {index}; the suite needs groups ordered like the mesh")
    return group, size, index


def gather_along(x: torch.Tensor, group: Any, size: int, dim: int) -> torch.Tensor:
    """Concatenate ``x`` over ``group`` (group-rank order) along ``dim``; no autograd."""
    xm = x.movedim(dim, 0).contiguous()
    out = xm.new_empty((size * xm.shape[0], *xm.shape[1:]))
    _all_gather_1(out, xm, group=group)
    return out.movedim(0, dim)


def _reduce_scatter_along(x: torch.Tensor, group: Any, size: int, dim: int) -> torch.Tensor:
    xm = x.movedim(dim, 0).contiguous()
    if xm.shape[0] % size:
        raise ValueError(f"reduce_scatter: dim {dim} of size {xm.shape[0]} does not divide "
                         f"by the group size {size}")
    out = xm.new_empty((xm.shape[0] // size, *xm.shape[1:]))
    _reduce_scatter_1(out, xm, group=group)
    return out.movedim(0, dim)


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, size: int, index: int,
                dim: int) -> torch.Tensor:
        ctx.group, ctx.size, ctx.index, ctx.dim = group, size, index, dim
        ctx.n = x.shape[dim]
        ctx.no_reduce = is_planted("allgather_bwd_no_reduce")
        return gather_along(x, group, size, dim)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if ctx.no_reduce:  # the bug: keep our slice, ignore what the other ranks did with it
            gx = g.narrow(ctx.dim, ctx.index * ctx.n, ctx.n).contiguous()
        else:
            gx = _reduce_scatter_along(g, ctx.group, ctx.size, ctx.dim)
        return gx, None, None, None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, size: int, index: int,
                dim: int) -> torch.Tensor:
        ctx.group, ctx.size, ctx.dim = group, size, dim
        if is_planted("reduce_scatter_no_sum"):
            n = x.shape[dim] // size
            return x.narrow(dim, index * n, n).contiguous()
        return _reduce_scatter_along(x, group, size, dim)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return gather_along(g, ctx.group, ctx.size, ctx.dim), None, None, None, None


def all_gather(x: torch.Tensor, mesh: Any, axis: str, dim: int) -> torch.Tensor:
    """Concatenate the ``x`` of every rank along mesh ``axis`` on tensor dim ``dim``.

    Blocks are ordered by mesh coordinate. Backward reduce-scatters (sums) the gradient,
    because every rank's copy of a block may have been used differently.

    Example: on a 1x2 mesh, ``all_gather(x_local, mesh, "cp1", dim=1)`` turns the
    ``(a, b, c)`` block of a pair tensor into the ``(a, 2b, c)`` row stripe.
    """
    group, size, index = axis_info(mesh, axis)
    if size == 1:
        return x
    return apply_fn(_AllGather, x, group, size, index, dim % x.ndim)


def reduce_scatter(x: torch.Tensor, mesh: Any, axis: str, dim: int) -> torch.Tensor:
    """Sum ``x`` over the ranks of mesh ``axis`` and keep this rank's block of ``dim``.

    ``dim`` must divide by the axis size. Backward all-gathers the gradient.

    Example: ``reduce_scatter(partial, mesh, "cp0", dim=0)`` on a 2x1 mesh sums two
    ``(2m, c)`` partial results and returns rows ``[index*m, (index+1)*m)``.
    """
    group, size, index = axis_info(mesh, axis)
    if size == 1:
        return x
    return apply_fn(_ReduceScatter, x, group, size, index, dim % x.ndim)


class _ReplicateGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, p: torch.Tensor, groups: tuple[Any, ...]) -> torch.Tensor:
        ctx.groups = groups
        ctx.skip = is_planted("no_grad_allreduce")
        return p.view_as(p)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        if ctx.skip:  # the bug: a per-rank partial gradient reaches the optimizer
            return g, None
        g = g.contiguous().clone()
        for group in ctx.groups:
            dist.all_reduce(g, group=group)
        return g, None


def replicate_grad(param: torch.Tensor, mesh: Any, axes: Sequence[str]) -> torch.Tensor:
    """Use a replicated parameter on sharded activations: identity forward, all-reduce backward.

    Each rank only sees its shard of the activations, so its gradient for a replicated
    parameter is a partial sum; the true gradient is the sum over every mesh axis the
    activations are sharded on (``axes``). Doing the all-reduce here, at the point of
    use, keeps every rank's ``param.grad`` complete and identical, so any optimizer can
    step it without knowing about the mesh.

    Mutant ``no_grad_allreduce`` skips the all-reduce.

    Example::

        w = replicate_grad(self.weight, mesh, ("cp0", "cp1"))
        y = torch.nn.functional.linear(x_local, w)
    """
    groups = tuple(axis_info(mesh, a)[0] for a in axes if axis_info(mesh, a)[1] > 1)
    if not groups:
        return param
    return apply_fn(_ReplicateGrad, param, groups)


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, groups: tuple[Any, ...]) -> torch.Tensor:
        ctx.groups = groups
        ctx.double = is_planted("loss_double_count")
        y = x.contiguous().clone()
        for group in groups:
            dist.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        if ctx.double:  # the bug: treat every rank's copy of the total as a separate loss
            g = g.contiguous().clone()
            for group in ctx.groups:
                dist.all_reduce(g, group=group)
        return g, None


def all_reduce_sum(x: torch.Tensor, mesh: Any, axes: Sequence[str]) -> torch.Tensor:
    """Sum ``x`` over mesh ``axes``; backward passes the gradient through unchanged.

    This is the right derivative for a *replicated* result such as a loss: every rank
    holds the same total ``L = sum_r x_r`` and back-propagates it once, and
    ``dL/dx_r = 1`` — summing the gradients again would count the loss once per rank.

    Mutant ``loss_double_count`` all-reduces in backward too.

    Example: ``loss = all_reduce_sum(local_sq_err.sum(), mesh, ("cp0", "cp1")) / n``.
    """
    groups = tuple(axis_info(mesh, a)[0] for a in axes if axis_info(mesh, a)[1] > 1)
    if not groups:
        return x
    return apply_fn(_AllReduceSum, x, groups)


# --------------------------------------------------------------------------- pair transpose

def _overlap(a0: int, a1: int, b0: int, b1: int) -> tuple[int, int] | None:
    lo, hi = max(a0, b0), min(a1, b1)
    return (lo, hi) if lo < hi else None


def _transpose_blocks(x: torch.Tensor, mesh: Any, rdim: int, cdim: int,
                      view_bug: bool) -> torch.Tensor:
    nr, nc = mesh.size(0), mesh.size(1)
    r, c = mesh.get_local_rank("cp0"), mesh.get_local_rank("cp1")
    a, b = x.shape[rdim], x.shape[cdim]
    if a * nr != b * nc:
        raise ValueError(f"transpose_pair: local block {a}x{b} on a {nr}x{nc} mesh is not a "
                         f"square pair tensor ({a * nr} rows, {b * nc} cols); pad both dims "
                         "to pair_size(N, mesh)")
    ranks = mesh.mesh
    me = dist.get_rank() if dist.is_initialized() else 0
    out = x.new_empty(x.shape)

    def place(blk: torch.Tensor, z_rows: tuple[int, int], z_cols: tuple[int, int]) -> None:
        # z[rows, cols] lands at w[cols, rows] (w = z^T), in our block's coordinates
        if view_bug:
            shape = list(blk.shape)
            shape[rdim], shape[cdim] = shape[cdim], shape[rdim]
            blk_t = blk.reshape(shape)
        else:
            blk_t = blk.transpose(rdim, cdim)
        dst = out.narrow(rdim, z_cols[0] - r * a, z_cols[1] - z_cols[0])
        dst = dst.narrow(cdim, z_rows[0] - c * b, z_rows[1] - z_rows[0])
        dst.copy_(blk_t)

    ops: list[Any] = []
    received: list[tuple[torch.Tensor, tuple[int, int], tuple[int, int]]] = []
    for r2 in range(nr):
        for c2 in range(nc):
            peer = int(ranks[r2, c2])
            # what (r2, c2) needs from us: z rows in its column block, cols in its row block
            rows = _overlap(r * a, (r + 1) * a, c2 * b, (c2 + 1) * b)
            cols = _overlap(c * b, (c + 1) * b, r2 * a, (r2 + 1) * a)
            if rows and cols:
                blk = x.narrow(rdim, rows[0] - r * a, rows[1] - rows[0])
                blk = blk.narrow(cdim, cols[0] - c * b, cols[1] - cols[0])
                if peer == me:
                    place(blk, rows, cols)
                else:
                    ops.append(dist.P2POp(dist.isend, blk.contiguous(), peer))
            # what we need from (r2, c2): z rows in our column block, cols in our row block
            rows = _overlap(r2 * a, (r2 + 1) * a, c * b, (c + 1) * b)
            cols = _overlap(c2 * b, (c2 + 1) * b, r * a, (r + 1) * a)
            if rows and cols and peer != me:
                shape = list(x.shape)
                shape[rdim], shape[cdim] = rows[1] - rows[0], cols[1] - cols[0]
                buf = x.new_empty(shape)
                ops.append(dist.P2POp(dist.irecv, buf, peer))
                received.append((buf, rows, cols))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    for buf, rows, cols in received:
        place(buf, rows, cols)
    return out


class _TransposePair(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mesh: Any, rdim: int, cdim: int) -> torch.Tensor:
        ctx.mesh, ctx.rdim, ctx.cdim = mesh, rdim, cdim
        ctx.view_bug = is_planted("transpose_view_not_permute")
        return _transpose_blocks(x, mesh, rdim, cdim, ctx.view_bug)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        # <T z, g> = sum_ij z_ji g_ij = <z, T g>: the transpose is its own adjoint
        return _transpose_blocks(g, ctx.mesh, ctx.rdim, ctx.cdim, ctx.view_bug), None, None, None


def transpose_pair(x: torch.Tensor, mesh: Any, row_dim: int = -3,
                   col_dim: int = -2) -> torch.Tensor:
    """This rank's block of ``z^T`` (``w[..., i, j, :] = z[..., j, i, :]``), same layout as ``z``.

    ``x`` is this rank's block of a square (padded) pair tensor ``z`` laid out by
    :func:`~cpmatrix.suite.distribute.pair_placements`: rank ``(r, c)`` holds
    ``z[I_r, J_c]`` with row blocks ``I_r`` cut over cp0 and column blocks ``J_c`` over
    cp1. The result is ``w[I_r, J_c] = z[J_c, I_r]`` with the pair dims swapped, i.e.
    the same placements applied to the transposed tensor. A triangle update uses it to
    turn "the rows ``j`` I need" (``b[J_c, :]``) into columns of a tensor it can gather
    along cp0 (``b^T[:, J_c]``).

    On a square mesh rank ``(r, c)`` swaps its whole block with ``(c, r)``; on a
    non-square mesh the row and column blocks have different sizes and each rank
    exchanges the overlapping sub-blocks with several peers (point-to-point,
    ``batch_isend_irecv``). Backward is the same transpose.

    Mutant ``transpose_view_not_permute``: blocks are reshaped instead of transposed.

    Example::

        bt = transpose_pair(b_local, mesh)          # b: (Np/R, Np/C, h) block of b
        bt_cols = all_gather(bt, mesh, "cp0", dim=0)  # b^T[:, J_c] = b[J_c, :]^T
    """
    rdim, cdim = row_dim % x.ndim, col_dim % x.ndim
    if rdim == cdim:
        raise ValueError("transpose_pair: row_dim and col_dim must differ")
    return apply_fn(_TransposePair, x, mesh, rdim, cdim)


# --------------------------------------------------------------------------- ring

@dataclass(frozen=True, slots=True)
class Ring:
    """A ring of ranks: ``ranks`` (global ranks in ring order) and our position in it.

    Block ``k`` of a sharded sequence lives on ``ranks[k]``; the ring sends to
    ``ranks[index + 1]`` and receives from ``ranks[index - 1]``.
    """

    ranks: tuple[int, ...]
    index: int

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def next_rank(self) -> int:
        return self.ranks[(self.index + 1) % self.size]

    @property
    def prev_rank(self) -> int:
        return self.ranks[(self.index - 1) % self.size]

    @classmethod
    def along(cls, mesh: Any, axes: Sequence[str]) -> Ring:
        """The ring over mesh ``axes`` (row-major in the order given) through this rank.

        ``Ring.along(mesh, ("cp0", "cp1"))`` is the flattened mesh (rank ``(r, c)`` at
        position ``r * C + c``, matching :func:`~cpmatrix.suite.distribute.seq_placements`);
        ``Ring.along(mesh, ("cp1",))`` is this rank's mesh row.
        """
        names = list(mesh.mesh_dim_names)
        coord = mesh.get_coordinate()
        idx: list[Any] = [coord[i] for i in range(len(names))]
        for a in axes:
            idx[names.index(a)] = slice(None)
        sub = mesh.mesh[tuple(idx)]
        kept = [names.index(a) for a in names if a in axes]
        order = [kept.index(names.index(a)) for a in axes]
        flat = sub.permute(order).reshape(-1) if order else sub.reshape(-1)
        ranks = tuple(int(v) for v in flat.tolist())
        me = int(mesh.mesh[tuple(coord)])
        return cls(ranks=ranks, index=ranks.index(me))


class _Pending:
    def __init__(self, works: list[Any], bufs: list[torch.Tensor],
                 sent: list[torch.Tensor]) -> None:
        # keep the (possibly temporary, .contiguous()) send buffers alive until the sends
        # completed: nothing else may hold them once ring_exchange returns
        self._works, self._bufs, self._sent = works, bufs, sent

    def wait(self) -> list[torch.Tensor]:
        for w in self._works:
            w.wait()
        self._sent = []
        return self._bufs


def ring_exchange(tensors: Sequence[torch.Tensor], ring: Ring, *, tag: int = 0) -> _Pending:
    """Start sending ``tensors`` to the next rank and receiving their likes from the previous.

    Returns a handle whose ``wait()`` gives the received tensors, so the caller can
    compute on the current block while the next one travels. On a ring of one rank the
    tensors come back as they are. Exchanges in flight at the same time must use
    different ``tag`` ranges (tensor ``i`` travels with tag ``tag + i``).

    Example::

        pending = ring_exchange([k, v], ring)
        ...                                  # attend to the current k, v
        k, v = pending.wait()
    """
    if ring.size == 1:
        return _Pending([], list(tensors), [])
    ops, bufs, sent = [], [], []
    for i, t in enumerate(tensors):
        t = t.contiguous()
        buf = torch.empty_like(t)
        # distinct tags: gloo matches messages between one pair of ranks by tag
        ops.append(dist.P2POp(dist.isend, t, ring.next_rank, tag=tag + i))
        ops.append(dist.P2POp(dist.irecv, buf, ring.prev_rank, tag=tag + i))
        bufs.append(buf)
        sent.append(t)
    return _Pending(list(dist.batch_isend_irecv(ops)), bufs, sent)
