# Triton kernels are untyped by nature (triton parses their signatures itself):
# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Triton row softmax and the online-softmax merge used by ring attention.

Kernels (``@triton.jit`` module attributes, one program per row, the whole row in one
block of ``BLOCK`` lanes, fp32 arithmetic whatever the storage dtype):

* :data:`softmax_fwd_kernel` — ``y = softmax(x)`` and ``lse = logsumexp(x)`` per row. A
  row of only ``-inf`` (all keys masked) gives ``y = 0`` and ``lse = -inf``.
* :data:`softmax_bwd_kernel` — ``dx = y * (dy - sum(y * dy))``.
* :data:`lse_merge_kernel` — merges two partial attentions ``(o1, lse1)``, ``(o2, lse2)``
  over disjoint key sets (see :func:`cpmatrix.suite.ops.ring_attention.merge_partials`).

Python entry points: :func:`softmax` (autograd), :func:`softmax_with_lse` and
:func:`merge_partials_kernel` (forward only; ring attention does its own backward).
fp32 and bf16 only; fp64 raises ``TypeError``. CPU tensors need ``TRITON_INTERPRET=1``
set before triton is imported.

Example::

    y = softmax(x)                      # x: (..., n) float32 on cuda, or cpu + interpreter
    y, lse = softmax_with_lse(scores)
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from cpmatrix.suite._typing import apply_fn
from cpmatrix.suite.kernels._common import block_for, check_kernel_dtype, check_launchable

__all__ = [
    "SPILL_SPECS",
    "lse_merge_kernel",
    "merge_partials_kernel",
    "softmax",
    "softmax_bwd_kernel",
    "softmax_fwd_kernel",
    "softmax_with_lse",
]


@triton.jit
def softmax_fwd_kernel(x_ptr, y_ptr, lse_ptr, n_cols, x_stride, y_stride,
                       BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride overflows int32 on big inputs
    offs = tl.arange(0, BLOCK)
    valid = offs < n_cols
    x = tl.load(x_ptr + row * x_stride + offs, mask=valid, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)  # fully masked row: keep exp() at 0, not nan
    e = tl.exp(x - m)
    s = tl.sum(e, axis=0)
    s_safe = tl.where(s == 0.0, 1.0, s)  # no 1/0 or log(0), even in lanes tl.where drops
    inv = tl.where(s == 0.0, 0.0, 1.0 / s_safe)
    tl.store(y_ptr + row * y_stride + offs, (e * inv).to(y_ptr.dtype.element_ty), mask=valid)
    tl.store(lse_ptr + row, tl.where(s == 0.0, float("-inf"), m + tl.log(s_safe)))


@triton.jit
def softmax_bwd_kernel(y_ptr, dy_ptr, dx_ptr, n_cols, y_stride, dy_stride, dx_stride,
                       BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    valid = offs < n_cols
    y = tl.load(y_ptr + row * y_stride + offs, mask=valid, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * dy_stride + offs, mask=valid, other=0.0).to(tl.float32)
    dot = tl.sum(y * dy, axis=0)
    tl.store(dx_ptr + row * dx_stride + offs, (y * (dy - dot)).to(dx_ptr.dtype.element_ty),
             mask=valid)


@triton.jit
def lse_merge_kernel(o1_ptr, l1_ptr, o2_ptr, l2_ptr, o_ptr, l_ptr, n_cols,
                     BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    valid = offs < n_cols
    l1 = tl.load(l1_ptr + row)
    l2 = tl.load(l2_ptr + row)
    m = tl.maximum(l1, l2)
    m = tl.where(m == float("-inf"), 0.0, m)  # both partials empty: weights 0, not nan
    w1 = tl.exp(l1 - m)
    w2 = tl.exp(l2 - m)
    tot = w1 + w2
    tot_safe = tl.where(tot == 0.0, 1.0, tot)
    inv = tl.where(tot == 0.0, 0.0, 1.0 / tot_safe)
    o1 = tl.load(o1_ptr + row * n_cols + offs, mask=valid, other=0.0).to(tl.float32)
    o2 = tl.load(o2_ptr + row * n_cols + offs, mask=valid, other=0.0).to(tl.float32)
    o = (o1 * w1 + o2 * w2) * inv
    tl.store(o_ptr + row * n_cols + offs, o.to(o_ptr.dtype.element_ty), mask=valid)
    tl.store(l_ptr + row, tl.where(tot == 0.0, float("-inf"), m + tl.log(tot_safe)))


#: How a spill gate compiles each kernel ahead of time: ``triton.compile(ASTSource(fn=
#: getattr(module, attr), signature=spec["signature"], constexprs=spec["constexprs"]),
#: target=GPUTarget("cuda", 90, 32), options=spec["options"])``. BLOCK is the largest
#: row the suite launches (the one most likely to spill); bf16 variants swap ``*fp32``
#: for ``*bf16`` on the data pointers.
SPILL_SPECS: dict[str, dict[str, Any]] = {
    "softmax_fwd_kernel": {
        "signature": {"x_ptr": "*fp32", "y_ptr": "*fp32", "lse_ptr": "*fp32", "n_cols": "i32",
                      "x_stride": "i32", "y_stride": "i32", "BLOCK": "constexpr"},
        "constexprs": {"BLOCK": 1024},
        "options": {"num_warps": 4},
    },
    "softmax_bwd_kernel": {
        "signature": {"y_ptr": "*fp32", "dy_ptr": "*fp32", "dx_ptr": "*fp32", "n_cols": "i32",
                      "y_stride": "i32", "dy_stride": "i32", "dx_stride": "i32",
                      "BLOCK": "constexpr"},
        "constexprs": {"BLOCK": 1024},
        "options": {"num_warps": 4},
    },
    "lse_merge_kernel": {
        "signature": {"o1_ptr": "*fp32", "l1_ptr": "*fp32", "o2_ptr": "*fp32", "l2_ptr": "*fp32",
                      "o_ptr": "*fp32", "l_ptr": "*fp32", "n_cols": "i32", "BLOCK": "constexpr"},
        "constexprs": {"BLOCK": 256},
        "options": {"num_warps": 4},
    },
}


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).contiguous()


def softmax_with_lse(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row softmax of ``x (..., n)`` and its float32 log-sum-exp ``(...)``; no autograd.

    Example: ``p, lse = softmax_with_lse(scores)`` (``-inf`` entries are masked keys).
    """
    check_kernel_dtype(x.dtype, "softmax_with_lse")
    check_launchable(softmax_fwd_kernel, x, "softmax_with_lse")
    x2 = _rows(x)
    y = torch.empty_like(x2)
    lse = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
    if x2.numel():
        block = block_for(x2.shape[1], "softmax_with_lse")
        softmax_fwd_kernel[(x2.shape[0],)](x2, y, lse, x2.shape[1], x2.stride(0), y.stride(0),
                                           BLOCK=block)
    return y.view(x.shape), lse.view(x.shape[:-1])


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y, _ = softmax_with_lse(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        y2, dy2 = _rows(y), _rows(dy.to(y.dtype))
        dx = torch.empty_like(y2)
        if y2.numel():
            block = block_for(y2.shape[1], "softmax backward")
            softmax_bwd_kernel[(y2.shape[0],)](y2, dy2, dx, y2.shape[1], y2.stride(0),
                                               dy2.stride(0), dx.stride(0), BLOCK=block)
        return dx.view(y.shape)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim with Triton forward and backward kernels.

    Example: ``torch.testing.assert_close(softmax(x), torch.softmax(x, -1))`` (fp32).
    """
    return apply_fn(_Softmax, x)


def merge_partials_kernel(o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor,
                          l2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`~cpmatrix.suite.ops.ring_attention.merge_partials`; no autograd.

    ``o_i (..., S, D)`` in fp32/bf16, ``l_i (..., S)`` float32.
    """
    check_kernel_dtype(o1.dtype, "merge_partials_kernel")
    check_launchable(lse_merge_kernel, o1, "merge_partials_kernel")
    o1r, o2r = _rows(o1), _rows(o2.to(o1.dtype))
    l1r = l1.reshape(-1).to(torch.float32).contiguous()
    l2r = l2.reshape(-1).to(torch.float32).contiguous()
    out, lse = torch.empty_like(o1r), torch.empty_like(l1r)
    if o1r.numel():
        block = block_for(o1r.shape[1], "merge_partials_kernel")
        lse_merge_kernel[(o1r.shape[0],)](o1r, l1r, o2r, l2r, out, lse, o1r.shape[1], BLOCK=block)
    return out.view(o1.shape), lse.view(l1.shape)
