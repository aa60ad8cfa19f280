"""Buffers that are partial by design: ``check_parity(..., buffers={"name": {"cp0": Partial()}})``.

A MoE's ``tokens_per_expert`` counts each rank's own tokens; the sum over the data-parallel
axis happens later (in an optimizer pre-hook, or where the load-balancing loss reads it).
Compared right after backward, each rank's count is a partial one, and the serial count
is the sum. Declaring the buffer ``Partial`` over that axis makes the toolkit reduce a copy
of it over the axis (``all_reduce`` with the placement's op: sum, avg, max, min) before
comparing; the module's own buffer is left as it is. A buffer not declared is compared as
it is.

Private: cases use :mod:`cpmatrix.parity`'s public names only (``check_parity``'s
``buffers=`` argument).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from cpmatrix.parity.errors import Check, ParityError

__all__ = ["BufferPlacements", "PartialBuffer", "plan_buffers", "reduced"]

#: ``buffers=``: buffer name -> {mesh dim name: ``Partial()``}.
BufferPlacements = Mapping[str, Mapping[str, Any]]

_OPS = ("sum", "avg", "max", "min")


@dataclass(frozen=True, slots=True)
class PartialBuffer:
    """A buffer to reduce over mesh dims before it is compared."""

    name: str
    #: (mesh dim index, its name, reduce op) per declared dim.
    dims: tuple[tuple[int, str, str], ...]

    def line(self) -> str:
        over = ", ".join(f"{op} over {dim}" for _, dim, op in self.dims)
        return f"{self.name}: Partial by declaration, reduced ({over}) before comparing"


def plan_buffers(spec: BufferPlacements | None, cp_buffers: Mapping[str, torch.Tensor],
                 mesh: Any) -> list[PartialBuffer]:
    """``spec`` checked against the CP module's buffers and the mesh (a ``ParityError`` of
    check ``setup`` naming what is wrong and what is allowed).

    >>> from types import SimpleNamespace
    >>> from torch.distributed.tensor import Partial
    >>> mesh = SimpleNamespace(mesh_dim_names=("cp0", "cp1"))
    >>> plan_buffers({"n": {"cp0": Partial()}}, {"n": torch.zeros(2)}, mesh)[0].line()
    'n: Partial by declaration, reduced (sum over cp0) before comparing'
    >>> plan_buffers({"m": {"cp0": Partial()}}, {"n": torch.zeros(2)}, mesh)
    Traceback (most recent call last):
    ...
    cpmatrix.parity.errors.ParityError: buffers= names buffers the CP module does not have: ...
    """
    if not spec:
        return []
    if not isinstance(spec, Mapping):
        raise ParityError(Check.SETUP, f"buffers= must map buffer names to {{mesh dim: "
                                       f"Partial()}}, got a {type(spec).__name__}")
    unknown = sorted(set(spec) - set(cp_buffers))
    if unknown:
        raise ParityError(Check.SETUP, f"buffers= names buffers the CP module does not have: "
                                       f"{unknown} (its buffers: {sorted(cp_buffers)})")
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    plan = []
    for name, placements in spec.items():
        if not isinstance(placements, Mapping) or not placements:
            raise ParityError(Check.SETUP, f"buffers[{name!r}] must map mesh dims to Partial(), "
                                           f"e.g. {{'cp0': Partial()}}; got {placements!r}")
        dims = []
        for dim, placement in placements.items():
            if dim not in names:
                raise ParityError(Check.SETUP, f"buffers[{name!r}]: unknown mesh dim {dim!r} "
                                               f"(the mesh's dims: {list(names)})")
            op = getattr(placement, "reduce_op", None)
            is_partial = getattr(placement, "is_partial", lambda: False)()
            if not is_partial or op not in _OPS:
                raise ParityError(Check.SETUP, f"buffers[{name!r}][{dim!r}] must be a Partial "
                                               f"(reduce_op one of {list(_OPS)}), got "
                                               f"{placement!r}")
            dims.append((names.index(dim), dim, str(op)))
        plan.append(PartialBuffer(name, tuple(dims)))
    return plan


def reduced(cp_buffers: Mapping[str, torch.Tensor], plan: list[PartialBuffer],
            mesh: Any) -> dict[str, torch.Tensor]:
    """The CP buffers with each planned one replaced by a reduced copy (a collective over
    each declared dim of size > 1, on every rank alike)."""
    import torch.distributed as dist

    ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
           "min": dist.ReduceOp.MIN}
    out = dict(cp_buffers)
    for buf in plan:
        value = out[buf.name].detach().clone()
        for index, _, op in buf.dims:
            size = int(mesh.size(index))
            if size == 1:
                continue
            dist.all_reduce(value, op=ops[op], group=mesh.get_group(index))
            if op == "avg":
                value = value / size
        out[buf.name] = value
    return out
