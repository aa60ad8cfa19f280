"""Checks shared by the kernel wrappers; imports no triton."""

from __future__ import annotations

from typing import Any

import torch

#: The dtypes the Triton kernels accept.
KERNEL_DTYPES = (torch.float32, torch.bfloat16)

#: Widest row a single-block kernel handles (larger rows spill registers; see SPILL_SPECS).
MAX_BLOCK = 16384


def check_kernel_dtype(dtype: torch.dtype, what: str = "kernel") -> None:
    """Raise ``TypeError`` unless ``dtype`` is one the kernels support (fp32, bf16)."""
    if dtype not in KERNEL_DTYPES:
        raise TypeError(f"{what}: the Triton kernels take float32 or bfloat16, got {dtype}; "
                        "run float64 parity on path='reference'")


def check_launchable(kernel: Any, t: torch.Tensor, what: str) -> None:
    """Fail early (and clearly) where a launch could not work."""
    if t.device.type == "cuda":
        return
    if t.device.type != "cpu":
        raise RuntimeError(f"{what}: Triton kernels need CUDA or CPU tensors, got {t.device}")
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(kernel, InterpretedFunction):
        raise RuntimeError(f"{what}: CPU tensors run through Triton's interpreter, which needs "
                           "TRITON_INTERPRET=1 set before triton is first imported")


def block_for(n: int, what: str) -> int:
    """The power-of-two block that holds a row of ``n`` elements."""
    block = 1 << max(n - 1, 0).bit_length()
    if block > MAX_BLOCK:
        raise ValueError(f"{what}: rows of {n} elements exceed the single-block limit "
                         f"{MAX_BLOCK}")
    return max(block, 16)
