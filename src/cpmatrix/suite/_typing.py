"""Typing shims: torch's ``Function.apply`` is untyped; wrap it once instead of at every call."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["apply_fn"]


def apply_fn(fn: type[torch.autograd.Function], *args: Any) -> torch.Tensor:
    """``fn.apply(*args)`` typed as returning a tensor."""
    out: torch.Tensor = fn.apply(*args)  # type: ignore[no-untyped-call]
    return out
