# Triton kernels are untyped by nature (triton parses their signatures itself):
# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Triton LayerNorm over the last dim, forward and backward.

Kernels (``@triton.jit`` module attributes; fp32 arithmetic whatever the storage dtype):

* :data:`layer_norm_fwd_kernel` — one program per row: ``y = (x - mean) * rstd * w + b``,
  saving ``mean`` and ``rstd`` (float32) for backward.
* :data:`layer_norm_bwd_kernel` — one program per ``ROWS`` rows: ``dx`` per row and
  this program's partial sums of ``dw = sum(dy * xhat)`` and ``db = sum(dy)``, written to a
  ``(programs, n)`` buffer that torch sums (a second pass keeps the kernel free of atomics,
  so results are deterministic).

:func:`layer_norm` is the autograd entry point. fp32 and bf16 inputs (weights may be
fp32 under autocast; ``y`` has the input's dtype); fp64 raises ``TypeError``.

Example::

    y = layer_norm(x, weight, bias, eps=1e-5)   # == F.layer_norm(x, (n,), weight, bias)
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from cpmatrix.suite._typing import apply_fn
from cpmatrix.suite.kernels._common import block_for, check_kernel_dtype, check_launchable

__all__ = ["SPILL_SPECS", "layer_norm", "layer_norm_bwd_kernel", "layer_norm_fwd_kernel"]

#: Rows per backward program: enough to amortize the partial-sum write, few enough to
#: give a GPU many programs.
BWD_ROWS = 16


@triton.jit
def layer_norm_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, x_stride,
                          y_stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    valid = offs < n_cols
    x = tl.load(x_ptr + row * x_stride + offs, mask=valid, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(valid, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    y = xc * rstd * w + b
    tl.store(y_ptr + row * y_stride + offs, y.to(y_ptr.dtype.element_ty), mask=valid)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def layer_norm_bwd_kernel(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr,
                          n_rows, n_cols, x_stride, dy_stride, dx_stride,
                          ROWS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    valid = offs < n_cols
    w = tl.load(w_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(ROWS):
        row = pid * ROWS + i
        live = row < n_rows  # the last program may run past the end: mask, don't branch
        # The row's mask is a block comparison, not `valid & live`: Triton's interpreter
        # stores a scalar comparison under its operands' integer type, so broadcasting
        # `live` into a block gives an int64 array and `valid & live` an int32 mask.
        # Triton 3.6 to 3.8 converted such a mask to bool on load; 3.9's interpreter
        # rejects it ("mask has unsupported dtype"). Compiled, this form is one compare
        # against a select and needs fewer registers (Triton 3.6's ptxas: 64 instead of
        # 71/72 on sm_80/sm_90a).
        m = offs < tl.where(live, n_cols, 0)
        x = tl.load(x_ptr + row * x_stride + offs, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * dy_stride + offs, mask=m, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + row, mask=live, other=0.0)
        rstd = tl.load(rstd_ptr + row, mask=live, other=0.0)
        xhat = tl.where(m, (x - mean) * rstd, 0.0)
        wdy = w * dy
        c1 = tl.sum(xhat * wdy, axis=0) / n_cols
        c2 = tl.sum(wdy, axis=0) / n_cols
        dx = (wdy - (xhat * c1 + c2)) * rstd
        tl.store(dx_ptr + row * dx_stride + offs, dx.to(dx_ptr.dtype.element_ty), mask=m)
        dw_acc += dy * xhat
        db_acc += dy
    tl.store(dw_ptr + pid * n_cols + offs, dw_acc, mask=valid)
    tl.store(db_ptr + pid * n_cols + offs, db_acc, mask=valid)


#: See :data:`cpmatrix.suite.kernels.softmax.SPILL_SPECS` for how these are used.
SPILL_SPECS: dict[str, dict[str, Any]] = {
    "layer_norm_fwd_kernel": {
        "signature": {"x_ptr": "*fp32", "w_ptr": "*fp32", "b_ptr": "*fp32", "y_ptr": "*fp32",
                      "mean_ptr": "*fp32", "rstd_ptr": "*fp32", "n_cols": "i32",
                      "x_stride": "i32", "y_stride": "i32", "eps": "fp32",
                      "BLOCK": "constexpr"},
        "constexprs": {"BLOCK": 1024},
        "options": {"num_warps": 4},
    },
    "layer_norm_bwd_kernel": {
        "signature": {"x_ptr": "*fp32", "w_ptr": "*fp32", "dy_ptr": "*fp32", "mean_ptr": "*fp32",
                      "rstd_ptr": "*fp32", "dx_ptr": "*fp32", "dw_ptr": "*fp32", "db_ptr": "*fp32",
                      "n_rows": "i32", "n_cols": "i32", "x_stride": "i32", "dy_stride": "i32",
                      "dx_stride": "i32", "ROWS": "constexpr", "BLOCK": "constexpr"},
        "constexprs": {"ROWS": BWD_ROWS, "BLOCK": 1024},
        "options": {"num_warps": 4},
    },
}


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                eps: float) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        n_rows, n = x2.shape
        y = torch.empty_like(x2)
        mean = torch.empty(n_rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty_like(mean)
        wc, bc = w.contiguous(), b.contiguous()
        block = block_for(n, "layer_norm")
        if n_rows:
            layer_norm_fwd_kernel[(n_rows,)](x2, wc, bc, y, mean, rstd, n, x2.stride(0),
                                             y.stride(0), eps, BLOCK=block)
        ctx.save_for_backward(x2, wc, mean, rstd)
        ctx.shape, ctx.block, ctx.w_dtype, ctx.b_dtype = x.shape, block, w.dtype, b.dtype
        return y.view(x.shape)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2, w, mean, rstd = ctx.saved_tensors
        n_rows, n = x2.shape
        dy2 = dy.reshape(-1, n).to(x2.dtype).contiguous()
        dx = torch.empty_like(x2)
        progs = triton.cdiv(n_rows, BWD_ROWS)
        dw_part = torch.zeros((max(progs, 1), n), dtype=torch.float32, device=x2.device)
        db_part = torch.zeros_like(dw_part)
        if n_rows:
            layer_norm_bwd_kernel[(progs,)](x2, w, dy2, mean, rstd, dx, dw_part, db_part, n_rows,
                                            n, x2.stride(0), dy2.stride(0), dx.stride(0),
                                            ROWS=BWD_ROWS, BLOCK=ctx.block)
        return (dx.view(ctx.shape), dw_part.sum(0).to(ctx.w_dtype),
                db_part.sum(0).to(ctx.b_dtype), None)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
               eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dim of ``x`` with Triton kernels (forward and backward).

    Example::

        y = layer_norm(x, ln.weight, ln.bias, ln.eps)
    """
    check_kernel_dtype(x.dtype, "layer_norm")
    check_launchable(layer_norm_fwd_kernel, x, "layer_norm")
    if weight.shape != (x.shape[-1],) or bias.shape != (x.shape[-1],):
        raise ValueError(f"layer_norm: weight {tuple(weight.shape)} and bias "
                         f"{tuple(bias.shape)} must be ({x.shape[-1]},)")
    with torch.autocast(x.device.type, enabled=False):
        return apply_fn(_LayerNorm, x, weight, bias, float(eps))
