"""Triton kernels of the reference suite (the ``kernel`` path).

* :mod:`.softmax` — row softmax (forward with the row log-sum-exp, backward) and the
  online-softmax merge of two partial ``(out, lse)`` pairs, as ring attention uses them;
* :mod:`.layernorm` — LayerNorm forward and backward.

Importing this package does not import triton; the submodules do. Kernels take fp32 or
bf16 tensors only (fp64 raises ``TypeError``: run fp64 parity on the reference path).
On CUDA tensors they are compiled; on CPU tensors they run through Triton's interpreter,
which needs ``TRITON_INTERPRET=1`` in the environment *before triton is first imported*
(triton decides per ``@triton.jit`` at decoration time).

Each submodule keeps its ``@triton.jit`` functions as module attributes and lists them
in ``SPILL_SPECS`` (``attr -> {"signature": ..., "constexprs": ...}``) so a spill gate
can AOT-compile ``module:attr`` with ``triton.compiler.ASTSource``.
"""

from cpmatrix.suite.kernels._common import KERNEL_DTYPES, check_kernel_dtype

__all__ = ["KERNEL_DTYPES", "check_kernel_dtype"]
