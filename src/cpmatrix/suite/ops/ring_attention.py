"""Ring attention: exact softmax attention over a sequence sharded across a ring of ranks.

Each rank holds one block of queries and one block of keys/values. K/V (and the key
mask) travel around the ring with point-to-point messages; at every step a rank attends
its queries to the block it holds, producing a partial output and the log-sum-exp
(``lse``) of its scores, and folds it into a running result with the online-softmax
merge (:func:`merge_partials`). After ``P`` steps every query has seen every key.

Backward is its own ring (no autograd through communication): with the saved output
and ``lse`` each block's probabilities are recomputed, ``dQ`` accumulates locally,
and each block's ``dK``/``dV`` accumulators travel *with* the block; after the last
step one more shift hands them to the rank that owns the block.

Conventions: ``q (..., Sq, D)``, ``k (..., Sk, D)``, ``v (..., Sk, Dv)`` with the same
leading dims; ``key_mask`` broadcastable to ``(..., Sk)`` (True = attend); ``bias``
broadcastable to ``(..., Sq, Sk * P)`` indexed by *global* key position (the ring
position of the key block times ``Sk``). A query whose keys are all masked gets a zero
output and ``lse = -inf``. Low-precision inputs accumulate in float32; autocast is
switched off inside (the op chooses its own precision), so it behaves the same with
and without autocast.

Mutants: ``ring_skip_last_step``, ``lse_merge_sign``, ``ring_no_dkv_return``,
``pad_mask_off``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor, Shard

from cpmatrix.suite._typing import apply_fn
from cpmatrix.suite.distribute import from_local
from cpmatrix.suite.mutants import is_planted
from cpmatrix.suite.ops.collectives import Ring, ring_exchange

__all__ = [
    "attention_serial",
    "merge_partials",
    "ring_attention",
    "ring_attention_local",
]

_NEG_INF = float("-inf")


def _acc_dtype(*ts: torch.Tensor) -> tuple[torch.dtype, torch.dtype]:
    dtype = ts[0].dtype
    for t in ts[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    acc = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    return dtype, acc


def attention_serial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                     key_mask: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                     scale: float | None = None) -> torch.Tensor:
    """The serial twin: plain softmax attention on full tensors (autograd does backward).

    Same conventions as the ring version (masked-out rows give zeros, low precision
    accumulates in float32, autocast off inside).

    Example::

        out = attention_serial(q, k, v, key_mask=mask)   # q, k, v: (B, H, S, D)
    """
    with torch.autocast(q.device.type, enabled=False):
        dtype, acc = _acc_dtype(q, k, v)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        s = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) * scale
        if bias is not None:
            s = s + bias.to(acc)
        if key_mask is not None:
            s = s.masked_fill(~key_mask.bool()[..., None, :], _NEG_INF)
        lse = torch.logsumexp(s, dim=-1, keepdim=True)
        p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse))
        return torch.matmul(p, v.to(acc)).to(dtype)


def merge_partials(out1: torch.Tensor, lse1: torch.Tensor, out2: torch.Tensor,
                   lse2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Online-softmax merge of two partial attentions over disjoint key sets.

    ``out_i`` is softmax attention over key set ``i`` and ``lse_i`` the log-sum-exp of
    its scores (``-inf`` for an empty or fully masked set). The result is attention over
    the union: ``lse = log(e^lse1 + e^lse2)``, ``out = (e^lse1 out1 + e^lse2 out2) / e^lse``,
    computed around ``max(lse1, lse2)`` so nothing overflows.

    Mutant ``lse_merge_sign``: ``lse = m - log(w1 + w2)`` (the sign of the log term).

    Example::

        out, lse = merge_partials(out, lse, out_blk, lse_blk)   # (..., S, D), (..., S)
    """
    m = torch.maximum(lse1, lse2)
    m = torch.where(torch.isinf(m), 0.0, m)  # both empty: keep exp() finite, weights 0
    w1, w2 = torch.exp(lse1 - m), torch.exp(lse2 - m)
    tot = w1 + w2
    log_tot = torch.log(tot)
    lse = m - log_tot if is_planted("lse_merge_sign") else m + log_tot
    tot_safe = torch.where(tot == 0, 1.0, tot)
    out = (out1 * w1[..., None] + out2 * w2[..., None]) / tot_safe[..., None]
    return out, lse


def _scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None,
            bias: torch.Tensor | None, scale: float) -> torch.Tensor:
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias
    if mask is not None:
        s = s.masked_fill(mask[..., None, :] == 0, _NEG_INF)
    return s


def _block_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: torch.Tensor | None, bias: torch.Tensor | None, scale: float,
                   kernel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    s = _scores(q, k, mask, bias, scale)
    if kernel:
        from cpmatrix.suite.kernels.softmax import softmax_with_lse

        p, lse = softmax_with_lse(s)
    else:
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    return torch.matmul(p, v), lse


def _bias_block(bias: torch.Tensor | None, src: int, sk: int) -> torch.Tensor | None:
    return None if bias is None else bias[..., src * sk:(src + 1) * sk]


def _broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    return tuple(max(x, y) for x, y in zip(a, b, strict=True))


def _sum_to(g: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Undo broadcasting: sum ``g`` down to ``shape``."""
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(dim=tuple(range(lead)))
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(dim=dims, keepdim=True) if dims else g


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                key_mask: torch.Tensor | None, bias: torch.Tensor | None, ring: Ring,
                scale: float, kernel: bool) -> torch.Tensor:
        with torch.autocast(q.device.type, enabled=False):
            dtype, acc = _acc_dtype(q, k, v)
            qa, ka, va = q.to(acc), k.to(acc), v.to(acc)
            ignore_mask = is_planted("pad_mask_off")
            mask = None
            if key_mask is not None and not ignore_mask:
                # a concrete uint8 tensor: it travels with K/V (gloo has no bool sum ops
                # but sends bytes fine; broadcast dims must be materialized to be sent)
                mask = key_mask.to(torch.uint8).expand(*ka.shape[:-2], ka.shape[-2]).contiguous()
            ab = None if bias is None else bias.to(acc)
            nsteps, sk = ring.size, ka.shape[-2]
            if ab is not None and ab.shape[-1] != sk * nsteps:
                raise ValueError(f"ring_attention: bias has {ab.shape[-1]} key columns, "
                                 f"expected Sk * ring size = {sk} * {nsteps}")
            skip_last = is_planted("ring_skip_last_step") and nsteps > 1
            compute_steps = nsteps - 1 if skip_last else nsteps
            cur = [ka, va] if mask is None else [ka, va, mask]
            out = lse = None
            for step in range(nsteps):
                # start moving the next block before computing on this one
                pending = ring_exchange(cur, ring) if step < nsteps - 1 else None
                if step < compute_steps:
                    src = (ring.index - step) % nsteps
                    o_b, l_b = _block_forward(qa, cur[0], cur[1],
                                              cur[2] if mask is not None else None,
                                              _bias_block(ab, src, sk), scale, kernel)
                    if out is None or lse is None:
                        out, lse = o_b, l_b
                    elif kernel and not is_planted("lse_merge_sign"):
                        from cpmatrix.suite.kernels.softmax import merge_partials_kernel

                        out, lse = merge_partials_kernel(out, lse, o_b, l_b)
                    else:
                        out, lse = merge_partials(out, lse, o_b, l_b)
                if pending is not None:
                    cur = pending.wait()
            assert out is not None and lse is not None
        ctx.save_for_backward(q, k, v, mask, bias, out, lse)
        ctx.ring, ctx.scale, ctx.dtype, ctx.acc = ring, scale, dtype, acc
        ctx.no_return = is_planted("ring_no_dkv_return")
        return out.to(dtype)

    @staticmethod
    def backward(ctx: Any, g_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, mask, bias, out, lse = ctx.saved_tensors
        ring, scale, acc = ctx.ring, ctx.scale, ctx.acc
        with torch.autocast(q.device.type, enabled=False):
            qa, ka, va, go = q.to(acc), k.to(acc), v.to(acc), g_out.to(acc)
            ab = None if bias is None else bias.to(acc)
            delta = (go * out).sum(-1, keepdim=True)  # rowsum(dO * O), the softmax-bwd term
            lse_safe = torch.where(torch.isinf(lse), 0.0, lse)[..., None]
            nsteps, sk = ring.size, ka.shape[-2]
            dq = torch.zeros_like(qa)
            want_bias = bias is not None and ctx.needs_input_grad[4]
            dbias = None
            if want_bias:
                dbias = qa.new_zeros(_broadcast_shape((*qa.shape[:-1], sk * nsteps),
                                                      tuple(bias.shape)))
            kv = [ka, va] if mask is None else [ka, va, mask]
            dk, dv = torch.zeros_like(ka), torch.zeros_like(va)
            for step in range(nsteps):
                pending = ring_exchange(kv, ring) if step < nsteps - 1 else None
                src = (ring.index - step) % nsteps
                kk, vv = kv[0], kv[1]
                s = _scores(qa, kk, kv[2] if mask is not None else None,
                            _bias_block(ab, src, sk), scale)
                p = torch.exp(s - lse_safe)
                dv = dv + torch.matmul(p.transpose(-1, -2), go)
                ds = p * (torch.matmul(go, vv.transpose(-1, -2)) - delta)
                dq = dq + torch.matmul(ds, kk) * scale
                dk = dk + torch.matmul(ds.transpose(-1, -2), qa) * scale
                if dbias is not None:
                    dbias[..., src * sk:(src + 1) * sk] = ds
                if pending is not None:
                    # the accumulators travel with their block (tags above the K/V ones)
                    dk, dv = ring_exchange([dk, dv], ring, tag=8).wait()
                    kv = pending.wait()
            if nsteps > 1 and not ctx.no_return:
                # after P steps we hold block index+1's complete dK/dV: pass it home
                dk, dv = ring_exchange([dk, dv], ring, tag=8).wait()
        gb = None
        if dbias is not None:
            gb = _sum_to(dbias, bias.shape).to(bias.dtype)
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, gb, None, None, None)


def ring_attention_local(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring, *,
                         key_mask: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                         scale: float | None = None, path: str = "reference") -> torch.Tensor:
    """Ring attention on this rank's local blocks (see the module docstring for shapes).

    ``ring`` orders the blocks: rank ``ring.ranks[i]`` holds keys ``[i*Sk, (i+1)*Sk)``.
    ``path="kernel"`` computes each block's softmax and the merges with the Triton
    kernels (fp32/bf16 only); backward always uses torch.

    Example::

        ring = Ring.along(mesh, ("cp0", "cp1"))
        out = ring_attention_local(q_loc, k_loc, v_loc, ring, key_mask=m_loc)
    """
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"ring_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)} need the same leading dims and k, v the same Sk")
    if path not in ("reference", "kernel"):
        raise ValueError(f"path must be 'reference' or 'kernel', got {path!r}")
    if path == "kernel":
        from cpmatrix.suite.kernels import check_kernel_dtype

        check_kernel_dtype(_acc_dtype(q, k, v)[0], "ring_attention(path='kernel')")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return apply_fn(_RingAttention, q, k, v, key_mask, bias, ring, scale, path == "kernel")


def _ring_axes(x: DTensor, dim: int) -> tuple[str, ...]:
    names = x.device_mesh.mesh_dim_names or ()
    return tuple(n for n, p in zip(names, x.placements, strict=True)
                 if isinstance(p, Shard) and p.dim == dim)


def ring_attention(q: DTensor, k: DTensor, v: DTensor, *, key_mask: DTensor | None = None,
                   scale: float | None = None, path: str = "reference") -> DTensor:
    """Ring attention on DTensors whose sequence dim (``-2``) is sharded.

    The ring runs over the mesh dims that shard the sequence, in mesh order (e.g.
    :func:`~cpmatrix.suite.distribute.seq_placements` gives the flattened mesh); mesh
    dims where the tensors are replicated repeat the same computation. ``key_mask``
    (``(..., S)``, True = attend) must be sharded the same way and is required whenever
    the sequence was padded to divide.

    Example::

        pl = seq_placements(2)                                   # (B, H, S, D)
        qd, kd, vd = (pad_and_shard(t, mesh, pl) for t in (q, k, v))
        md = pad_and_shard(mask, mesh, pl)        # (B, 1, S) bool, padding -> False
        out = ring_attention(qd, kd, vd, key_mask=md)            # DTensor (B, H, S, D)
    """
    seq = q.ndim - 2
    axes = _ring_axes(q, seq)
    if k.placements != q.placements or v.placements != q.placements:
        raise ValueError(f"q, k, v must share placements; got {q.placements}, "
                         f"{k.placements}, {v.placements}")
    mask_local = None
    if key_mask is not None:
        if _ring_axes(key_mask, key_mask.ndim - 1) != axes:
            raise ValueError(f"key_mask must shard its last dim over {axes}; got "
                             f"{key_mask.placements}")
        mask_local = key_mask.to_local()
    ring = Ring.along(q.device_mesh, axes)
    out = ring_attention_local(q.to_local(), k.to_local(), v.to_local(), ring,
                               key_mask=mask_local, scale=scale, path=path)
    return from_local(out, q.device_mesh, q.placements, (*q.shape[:-1], v.shape[-1]))

