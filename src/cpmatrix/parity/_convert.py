"""Converting a model to a cell's dtype without changing what it computes, and the warnings
raised on the way.

``Module.to(torch.float64)`` casts *complex* tensors too, to a real dtype: a RoPE table of
``complex64`` (``freqs_cis``) silently loses its imaginary part and both sides then run a
model without rotary embeddings. So the toolkit converts tensor by tensor: floating point
to the cell's storage dtype, complex to the complex dtype of the cell's precision
(``complex128`` for fp64 cells, ``complex64`` otherwise: torch has no complex bf16, and its
``complex32`` lacks most ops), integers and bools untouched. What was converted and what
was left alone is evidence.

Torch reports a discarded imaginary part only with a warning, once per process
(``TORCH_WARN_ONCE``): :func:`recording_warnings` makes such warnings fire every time while
a check prepares and runs the two sides, and keeps them for the report;
:func:`warning_outcome` fails ``setup`` on one that discarded an imaginary part
(:func:`record_warnings` records that verdict and the warnings as evidence).

Private: cases use :mod:`cpmatrix.parity`'s public names only.

Example::

    >>> m = torch.nn.Module()
    >>> m.register_buffer("freqs", torch.polar(torch.ones(2), torch.ones(2)))
    >>> m.register_buffer("steps", torch.zeros((), dtype=torch.int64))
    >>> convert_module(m, dtype=torch.float64, device="cpu")
    ['buffer freqs: torch.complex64 -> torch.complex128', 'buffer steps: torch.int64 (left alone)']
    >>> m.freqs.dtype
    torch.complex128
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from cpmatrix.parity.errors import Check
from cpmatrix.parity.verdict import CheckOutcome

if TYPE_CHECKING:
    from cpmatrix.parity._report import Verdicts

__all__ = [
    "DISCARDED_IMAGINARY",
    "complex_of",
    "convert_module",
    "record_warnings",
    "recording_warnings",
    "target_dtype",
    "warning_outcome",
]

#: What torch says when a copy or cast drops an imaginary part (aten/native/Copy.cpp).
DISCARDED_IMAGINARY = "discards the imaginary part"


def complex_of(dtype: torch.dtype) -> torch.dtype:
    """The complex dtype of a precision: complex128 for float64, else complex64.

    >>> complex_of(torch.float64), complex_of(torch.bfloat16)
    (torch.complex128, torch.complex64)
    """
    return torch.complex128 if dtype == torch.float64 else torch.complex64


def target_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.dtype | None:
    """What ``t`` becomes in a model converted to ``dtype`` (None: left alone)."""
    if t.is_floating_point():
        return dtype
    if t.is_complex():
        return complex_of(dtype)
    return None


def convert_module(module: torch.nn.Module, *, dtype: torch.dtype, device: Any) -> list[str]:
    """Convert ``module`` in place (as ``Module.to`` does, through ``_apply``) to ``dtype``:
    floating parameters and buffers to ``dtype``, complex ones to :func:`complex_of`
    ``dtype``, integer and bool ones untouched (moved to ``device`` only). Returns one line
    per buffer (converted or left alone) and one for the parameters."""
    before = {name: b.dtype for name, b in module.named_buffers()}
    params: dict[str, int] = {}
    for p in module.parameters():
        key = f"{p.dtype} -> {target_dtype(p, dtype) or p.dtype}"
        params[key] = params.get(key, 0) + 1

    def convert(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=target_dtype(t, dtype))

    module._apply(convert)  # type: ignore[no-untyped-call]  # what Module.to calls
    lines = []
    for name, b in module.named_buffers():
        old = before.get(name, b.dtype)
        if target_dtype(b, dtype) is None:
            lines.append(f"buffer {name}: {old} (left alone)")
        else:
            lines.append(f"buffer {name}: {old} -> {b.dtype}")
    if params:
        lines.append("parameters: " + ", ".join(f"{n} {k}" for k, n in params.items()))
    return lines


@contextmanager
def recording_warnings(sink: list[str]) -> Iterator[None]:
    """Every warning raised inside goes to ``sink`` (``Category: message``), not to the log.

    ``torch.set_warn_always(True)`` while inside, restored after: a torch warning issued
    "once per process" (a discarded imaginary part, a deprecated path) would otherwise be
    seen only by the first cell of a world.
    """
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield
            finally:
                sink.extend(f"{w.category.__name__}: {w.message}" for w in caught)
    finally:
        torch.set_warn_always(before)


def warning_outcome(sink: list[str]) -> CheckOutcome:
    """``setup``'s verdict on the warnings of a check: each one is evidence (counted once),
    and one that discarded an imaginary part is a problem: the model no longer computes
    what it did (a complex RoPE table cast to real runs a model without rotary embeddings).
    """
    out = CheckOutcome()
    counts: dict[str, int] = {}
    for text in sink:
        counts[text] = counts.get(text, 0) + 1
    for text, n in counts.items():
        first = text.splitlines()[0] if text else text
        times = f" ({n}x)" if n > 1 else ""
        if DISCARDED_IMAGINARY in text:
            out.problems.append(
                f"a complex value was cast to a real dtype, discarding its imaginary part "
                f"({first}{times}): one side no longer computes what the model does (a "
                f"complex buffer such as a RoPE table declared real on one side?)")
        else:
            out.lines.append(f"warning{times}: {first}")
    out.summary = " | ".join(f"{t.splitlines()[0] if t else t}" + (f" ({n}x)" if n > 1 else "")
                             for t, n in counts.items())
    return out


def record_warnings(verdicts: Verdicts, sink: list[str]) -> None:
    """Record the warnings either side raised: ``setup``'s verdict on them and, when there
    were any, their summary as the ``warnings`` evidence."""
    outcome = warning_outcome(sink)
    verdicts.add(Check.SETUP, outcome)
    if sink:
        verdicts.evidence["warnings"] = outcome.summary
