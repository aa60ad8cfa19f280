"""Issue 30, row 5: torch flags with a getter that a cell leaves changed."""

from __future__ import annotations

from typing import Any

import torch


def leave_flags(cell: Any) -> None:
    torch.backends.mha.set_fastpath_enabled(False)
    torch._C._jit_set_profiling_executor(False)


def expect_defaults(cell: Any) -> None:
    assert torch.backends.mha.get_fastpath_enabled(), "the mha fast path is off"
    old = torch._C._jit_set_profiling_executor(True)
    assert old, "the JIT profiling executor is off"
