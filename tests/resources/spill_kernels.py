"""Small Triton kernels for tests/e2e/test_spill.py (imported as ``spill_kernels``).

:data:`row_softmax` holds a whole row in registers, so it is fine at BLOCK=1024 and
spills once a thread's share of the row outgrows the 255-register file. Measured with
triton 3.6.0 and its ptxas (12.8; sm_100+ use ptxas-blackwell 12.9):

=============  =====  =====  =========  ==========================================
BLOCK          warps  arch   registers  stack / spill stores / spill loads (bytes)
=============  =====  =====  =========  ==========================================
1024           4      sm_80  26         0 / 0 / 0
1024           4      sm_90a 29         0 / 0 / 0
8192           1      sm_80  255        144 / 144 / 188
8192           1      sm_90a 255        208 / 212 / 256
65536          4      sm_80  32         3912 / 6596 / 9756  (≈14 s to compile)
65536          4      sm_90a 32         3888 / 7516 / 9692  (≈8 s to compile)
=============  =====  =====  =========  ==========================================

BLOCK=8192 with one warp (8192 fp32 values over 32 threads) is the cheapest spilling
configuration found (~3 s), so the tests use it as the spilling case.
"""

import triton
import triton.language as tl

#: The Triton signature of :data:`row_softmax`.
ROW_SOFTMAX_SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n_cols": "i32", "stride": "i32",
                         "BLOCK": "constexpr"}


@triton.jit
def row_softmax(x_ptr, y_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    valid = offs < n_cols
    x = tl.load(x_ptr + row * stride + offs, mask=valid, other=float("-inf"))
    m = tl.max(x, axis=0)
    e = tl.exp(x - m)
    s = tl.sum(e, axis=0)
    tl.store(y_ptr + row * stride + offs, e / s, mask=valid)


@triton.jit
def scale_shift(x_ptr, y_ptr, a, b, n, BLOCK: tl.constexpr):
    """``y = x * a + b``: one fused multiply-add per element, unless fp fusion is off."""
    offs = tl.arange(0, BLOCK)
    valid = offs < n
    x = tl.load(x_ptr + offs, mask=valid)
    tl.store(y_ptr + offs, x * a + b, mask=valid)


#: The same kernel behind ``triton.autotune``: a gate expands one spec per config.
row_softmax_tuned = triton.autotune(
    configs=[triton.Config({"BLOCK": 1024}, num_warps=4),
             triton.Config({"BLOCK": 2048}, num_warps=8, num_stages=2)],
    key=["n_cols"],
)(row_softmax)


def not_a_kernel(x_ptr, y_ptr, n_cols, stride, BLOCK):
    """A plain function: naming it as a kernel is an error."""
    return None
