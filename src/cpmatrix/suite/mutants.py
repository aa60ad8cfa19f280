"""Planted bugs (mutants) for negative controls.

A parity test that passes with a broken implementation is worse than none. Every CP op of
the suite therefore has one or more *named* bugs that can be switched on at run time; a
test suite proves it has teeth by showing that each of them makes parity fail.

Switch one on for a block of code with :func:`planted`; the ops ask :func:`is_planted` at
the exact spot the bug lives. Ops whose bug sits in a backward pass read the flag in
*forward* and keep it on the autograd context, because backward may run on another
thread (CUDA autograd workers), where a context variable set by the caller is not
visible.

Example::

    from cpmatrix.suite.mutants import planted

    with planted(cell.mutant):            # None: nothing planted
        out = ring_attention(q, k, v, key_mask=mask)
        out.backward(grad)

The registry :data:`MUTANTS` names each bug, the module where it lives and what it does.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["MUTANTS", "Mutant", "active", "is_planted", "planted"]


@dataclass(frozen=True, slots=True)
class Mutant:
    """One planted bug: where it lives, what it breaks and what makes it visible."""

    name: str
    site: str
    effect: str
    #: What a parity check needs to see it (some bugs are invisible on a 1x1 mesh).
    needs: str


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant(
            "shard_offset_off_by_one",
            "suite.distribute.shard_range",
            "every shard after the first starts one element early (overlaps its left "
            "neighbour, loses its own last element)",
            "a sharded axis of size > 1",
        ),
        Mutant(
            "no_grad_allreduce",
            "suite.ops.collectives.replicate_grad",
            "gradients of replicated parameters are not all-reduced over the sharded mesh "
            "axes: each rank keeps only its own partial sum",
            "a sharded axis of size > 1 and a per-parameter gradient check",
        ),
        Mutant(
            "allgather_bwd_no_reduce",
            "suite.ops.collectives.all_gather (backward)",
            "the backward of the all-gather keeps this rank's slice of the gradient instead "
            "of reduce-scattering the gradients of every rank",
            "an axis of size > 1 and an input-gradient check",
        ),
        Mutant(
            "reduce_scatter_no_sum",
            "suite.ops.collectives.reduce_scatter",
            "the reduce-scatter returns this rank's slice of its own input without summing "
            "over the group",
            "an axis of size > 1",
        ),
        Mutant(
            "transpose_view_not_permute",
            "suite.ops.collectives.transpose_pair",
            "each exchanged block is reshaped to the transposed shape instead of permuted "
            "(a .view where a .transpose belongs)",
            "blocks larger than 1x1 (any mesh)",
        ),
        Mutant(
            "ring_skip_last_step",
            "suite.ops.ring_attention (forward)",
            "the ring loop stops one step early: the last K/V block is never attended to",
            "a ring of size > 1",
        ),
        Mutant(
            "lse_merge_sign",
            "suite.ops.ring_attention.merge_partials",
            "the merged log-sum-exp subtracts the log of the weight sum instead of adding "
            "it; outputs of one block stay right, everything merged later is wrong",
            "a ring of size > 1",
        ),
        Mutant(
            "ring_no_dkv_return",
            "suite.ops.ring_attention (backward)",
            "after the last ring step the accumulated dK/dV are not sent on to their owner: "
            "every rank returns the gradient of its right neighbour's block",
            "a ring of size > 1",
        ),
        Mutant(
            "pad_mask_off",
            "suite.ops.ring_attention (forward and backward)",
            "the key mask is ignored: padded (and masked) keys take part in the softmax",
            "a masked or padded key (sequence length not divisible by the ring)",
        ),
        Mutant(
            "tri_mask_off",
            "suite.ops.triangle",
            "the pair mask is not applied to the triangle projections: padded and masked "
            "pairs leak into the sum over the third node",
            "a masked or padded pair",
        ),
        Mutant(
            "loss_double_count",
            "suite.ops.collectives.all_reduce_sum (backward; the model's loss)",
            "the loss all-reduce is differentiated as an all-reduce: every gradient is "
            "multiplied by the number of ranks",
            "a mesh of more than one rank and an optimizer that is not scale-invariant (SGD)",
        ),
    )
}

_ACTIVE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "cpmatrix_suite_mutant", default=None
)


def active() -> str | None:
    """The mutant planted in the current context, or None."""
    return _ACTIVE.get()


def is_planted(name: str) -> bool:
    """True when ``name`` is the planted mutant. ``name`` must be registered.

    Example::

        if is_planted("no_grad_allreduce"):
            return grad  # the bug: skip the all-reduce
    """
    if name not in MUTANTS:  # a typo here would make a negative control vacuous
        raise KeyError(f"unknown mutant {name!r}; known: {sorted(MUTANTS)}")
    return _ACTIVE.get() == name


@contextlib.contextmanager
def planted(name: str | None) -> Iterator[None]:
    """Plant ``name`` for the duration of the block (``None`` plants nothing).

    Example::

        with planted("ring_skip_last_step"):
            out = ring_attention(q, k, v)
    """
    if name is not None and name not in MUTANTS:
        raise KeyError(f"unknown mutant {name!r}; known: {sorted(MUTANTS)}")
    token = _ACTIVE.set(name)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
