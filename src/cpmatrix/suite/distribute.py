"""The suite's sharding convention: pad a full tensor and cut this rank's shard out of it.

This is where the suite's CP code decides which rank holds which rows; it is part of the
code under test, not test infrastructure. The CP ops use it (directly or through
:func:`shard_range`, where the planted bug ``shard_offset_off_by_one`` lives) and the
suite's cases cut their CP inputs with it, so a bug here shows up on both sides of the
seam instead of hiding in a test-only helper.

It is not the toolkit's distributor (:func:`cpmatrix.parity.distribute`), which moves a
serial test value into the CP view for any project, by a data layout (symbolic axes,
grouped atoms, remapped indices) and DTensor's own chunking. A project with a production
sharding function of its own (as this one) plugs it into the toolkit's data module
(``SyntheticDataModule(distributor=...)``), so the tests exercise the real one.

Layout conventions (a 2-D mesh with dims ``("cp0", "cp1")`` of sizes ``(R, C)``):

* a *pair* tensor ``z`` of shape ``(..., N, N, c)`` is sharded rows over ``cp0`` and
  columns over ``cp1`` (:func:`pair_placements`); both dims are padded to the same ``Np``
  (a multiple of ``lcm(R, C)``, see :func:`pair_size`) so that ``z`` stays square;
* a *sequence* tensor ``s`` of shape ``(..., S, d)`` is sharded over the flattened mesh
  (:func:`seq_placements`): rank ``(r, c)`` holds block ``r * C + c``.

Shards are always even: sizes that do not divide are padded with ``pad_value`` (zero /
False), and masks padded with False are what keeps padding out of every reduction.
Unlike ``torch.distributed.tensor.distribute_tensor`` this needs no communication: the
full tensor must already be identical on every rank (drawn from a shared generator).

Example::

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("cp0", "cp1"))
    z = torch.randn(5, 5, 8, generator=g, dtype=torch.float64)      # same on all ranks
    zd = pad_and_shard(z, mesh, pair_placements(z.ndim), pad_to=pair_pad(z, mesh))
    zd.to_local().shape            # torch.Size([3, 3, 8]): N=5 padded to 6, halved twice
    undistribute(zd, z.shape)      # == z (the padding dropped)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard

from cpmatrix.suite._typing import apply_fn
from cpmatrix.suite.mutants import is_planted

__all__ = [
    "from_local",
    "local_slices",
    "mesh_device",
    "pad_and_shard",
    "padded_size",
    "pair_pad",
    "pair_placements",
    "pair_size",
    "seq_placements",
    "shard_parts",
    "shard_range",
    "undistribute",
]


def mesh_device(mesh: object) -> torch.device:
    """The device tensors of this rank live on for ``mesh`` (cpu, or the current cuda)."""
    kind = mesh.device_type  # type: ignore[attr-defined]
    if kind == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(kind)


def padded_size(n: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is >= ``n`` (``padded_size(7, 3) == 9``)."""
    if n < 0 or multiple < 1:
        raise ValueError(f"padded_size(n={n}, multiple={multiple}): need n >= 0, multiple >= 1")
    return -(-n // multiple) * multiple


def pair_size(n: int, mesh: object) -> int:
    """Padded side of an ``n x n`` pair tensor on ``mesh``: a multiple of ``lcm(R, C)``.

    Both pair dims get the same padded size so the tensor stays square, which the
    pair transpose needs. ``pair_size(5, mesh_2x3) == 6``.
    """
    r, c = mesh.size(0), mesh.size(1)  # type: ignore[attr-defined]
    return padded_size(n, math.lcm(r, c))


def pair_placements(ndim: int = 3, *, channels_last: bool = True) -> tuple[Placement, Placement]:
    """Placements of a pair tensor: rows over cp0, columns over cp1.

    ``ndim`` is the tensor's number of dims. A pair tensor ``(..., N, N, c)`` has its
    pair dims at ``ndim-3, ndim-2``; a pair mask ``(..., N, N)`` (``channels_last=False``)
    at ``ndim-2, ndim-1``. ``pair_placements(3) == (Shard(0), Shard(1))``.
    """
    row = ndim - 3 if channels_last else ndim - 2
    if row < 0:
        raise ValueError(f"a pair tensor of ndim={ndim} (channels_last={channels_last}) has no "
                         "pair dims; expected (..., N, N, c) or (..., N, N)")
    return (Shard(row), Shard(row + 1))


def pair_pad(full: torch.Tensor, mesh: object, *, channels_last: bool = True) -> dict[int, int]:
    """``pad_to`` for :func:`distribute` of a pair tensor (or mask with ``channels_last=False``)."""
    row = full.ndim - 3 if channels_last else full.ndim - 2
    n = full.shape[row]
    if full.shape[row + 1] != n:
        raise ValueError(f"pair tensor must be square in dims {row},{row + 1}; "
                         f"got {tuple(full.shape)}")
    np_ = pair_size(n, mesh)
    return {row: np_, row + 1: np_}


def seq_placements(dim: int) -> tuple[Placement, Placement]:
    """Placements of a tensor whose ``dim`` is sharded over the flattened (cp0, cp1) mesh."""
    return (Shard(dim), Shard(dim))


def _norm_placements(placements: Sequence[Placement], ndim: int) -> tuple[Placement, ...]:
    out: list[Placement] = []
    for p in placements:
        if isinstance(p, Shard):
            if not -ndim <= p.dim < ndim:
                raise ValueError(f"{p} is out of range for a tensor of ndim {ndim}")
            out.append(Shard(p.dim % ndim))
        elif isinstance(p, Replicate):
            out.append(p)
        else:
            raise ValueError(f"only Shard and Replicate placements are supported, got {p}")
    return tuple(out)


def shard_parts(mesh: object, placements: Sequence[Placement], tensor_dim: int,
                coordinate: Sequence[int] | None = None) -> tuple[int, int]:
    """``(parts, index)``: how many shards ``tensor_dim`` is cut into, and which one is ours.

    Mesh dims that shard the same tensor dim nest in mesh-dim order (DTensor's
    convention): with ``(Shard(0), Shard(0))`` on an ``R x C`` mesh, rank ``(r, c)``
    holds block ``r * C + c`` of ``R * C``.
    """
    coord = list(coordinate) if coordinate is not None else mesh.get_coordinate()  # type: ignore[attr-defined]
    if coord is None:
        raise RuntimeError("this rank is not part of the mesh")
    parts, index = 1, 0
    for mdim, p in enumerate(placements):
        if isinstance(p, Shard) and p.dim == tensor_dim:
            size = mesh.size(mdim)  # type: ignore[attr-defined]
            parts, index = parts * size, index * size + coord[mdim]
    return parts, index


def shard_range(size: int, parts: int, index: int) -> tuple[int, int]:
    """``[start, stop)`` of shard ``index`` when ``size`` is cut in ``parts`` even shards.

    Mutant ``shard_offset_off_by_one``: shards after the first start one element early.

    Example: ``shard_range(12, 3, 1) == (4, 8)``.
    """
    if size % parts:
        raise ValueError(f"{size} rows cannot be cut in {parts} even shards; pad to "
                         f"{padded_size(size, parts)} first "
                         "(pad_and_shard(..., pad_to_divisible=True))")
    step = size // parts
    start = index * step
    if index > 0 and is_planted("shard_offset_off_by_one"):
        start -= 1
    return start, start + step


def local_slices(shape: Sequence[int], mesh: object, placements: Sequence[Placement],
                 coordinate: Sequence[int] | None = None) -> tuple[slice, ...]:
    """The slices of a (padded) global ``shape`` this rank holds under ``placements``."""
    pl = _norm_placements(placements, len(shape))
    out = []
    for d, size in enumerate(shape):
        parts, index = shard_parts(mesh, pl, d, coordinate)
        start, stop = shard_range(size, parts, index)
        out.append(slice(start, stop))
    return tuple(out)


def pad_and_shard(full: torch.Tensor, mesh: object, placements: Sequence[Placement], *,
               pad_to_divisible: bool = True, pad_to: Mapping[int, int] | None = None,
               pad_value: float | bool = 0) -> DTensor:
    """Pad ``full`` and return this rank's shard of it as a ``DTensor`` (the suite's way).

    ``full`` must be the same on every rank (no data is sent). Each sharded dim is padded
    with ``pad_value`` up to a multiple of its number of shards (``pad_to_divisible``) or
    up to the size given in ``pad_to`` (``{dim: size}``; negative dims allowed), which
    must itself divide evenly. The DTensor's global shape is the padded shape; drop the
    padding again with :func:`undistribute`.

    Example::

        xd = pad_and_shard(x, mesh, seq_placements(0))         # x: (7, d) on a 1x3 mesh
        xd.to_local().shape[0] == 3                         # 7 padded to 9
    """
    ndim = full.ndim
    pl = _norm_placements(placements, ndim)
    if len(pl) != mesh.ndim:  # type: ignore[attr-defined]
        raise ValueError(f"need one placement per mesh dim ({mesh.ndim}), got {len(pl)}")  # type: ignore[attr-defined]
    target = list(full.shape)
    for d, size in (pad_to or {}).items():
        dd = d % ndim
        if size < full.shape[dd]:
            raise ValueError(f"pad_to[{d}]={size} is smaller than the tensor ({full.shape[dd]})")
        target[dd] = size
    for d in range(ndim):
        parts, _ = shard_parts(mesh, pl, d)
        if target[d] % parts:
            explicit = pad_to is not None and (d in pad_to or d - ndim in pad_to)
            if not pad_to_divisible or explicit:
                raise ValueError(f"dim {d} of size {target[d]} does not divide in {parts} shards; "
                                 f"pad it (pad_to_divisible=True) or choose a size that divides")
            target[d] = padded_size(target[d], parts)
    device = mesh_device(mesh)
    if list(full.shape) != target:
        padded = torch.full(target, pad_value, dtype=full.dtype, device=device)
        padded[tuple(slice(0, s) for s in full.shape)] = full.to(device)
    else:
        padded = full.to(device)
    local = padded[local_slices(target, mesh, pl)].contiguous()
    return DTensor.from_local(local, mesh, pl, run_check=False,  # type: ignore[arg-type]
                              shape=torch.Size(target), stride=padded.stride())


class _Gather(torch.autograd.Function):
    """All-gather a shard to the full tensor; backward keeps this rank's block of the grad.

    Same autograd semantics as ``DTensor.full_tensor()`` (the gathered tensor is
    *replicated*, so every rank's gradient for it is the same and nothing is summed), but
    without DTensor's warning about gathering nested shards in several steps.
    """

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, mesh: Any,
                placements: tuple[Placement, ...]) -> torch.Tensor:
        from cpmatrix.suite.ops.collectives import axis_info, gather_along

        ctx.mesh, ctx.placements, ctx.local_shape = mesh, placements, local.shape
        x = local
        # innermost mesh dim first: with (Shard(0), Shard(0)) block r*C + c sits on (r, c)
        for mdim in reversed(range(len(placements))):
            p = placements[mdim]
            if isinstance(p, Shard) and mesh.size(mdim) > 1:
                group, size, _ = axis_info(mesh, mesh.mesh_dim_names[mdim])
                x = gather_along(x, group, size, p.dim)
        # a Function must not hand back its input object (1x1 mesh: nothing gathered)
        return x.contiguous() if x is not local else x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        idx = []
        for d, n in enumerate(ctx.local_shape):
            _, index = shard_parts(ctx.mesh, ctx.placements, d)
            idx.append(slice(index * n, (index + 1) * n))
        return g[tuple(idx)], None, None


def undistribute(dt: DTensor, shape: Sequence[int]) -> torch.Tensor:
    """Gather ``dt`` on every rank and drop the padding: the full tensor of ``shape``.

    Differentiable with ``DTensor.full_tensor()``'s semantics: the result is replicated,
    and backward hands each rank the gradient of its own block. This is a collective:
    every rank of the mesh must call it.

    Example: ``torch.testing.assert_close(undistribute(out_dt, ref.shape), ref)``.
    """
    full = apply_fn(_Gather, dt.to_local(), dt.device_mesh, tuple(dt.placements))
    return full[tuple(slice(0, s) for s in shape)]


def from_local(local: torch.Tensor, mesh: object, placements: Sequence[Placement],
               shape: Sequence[int]) -> DTensor:
    """Wrap this rank's ``local`` shard as a DTensor of global ``shape`` (no communication).

    Differentiable, like ``DTensor.from_local``; the ops use it to hand results back in
    the placements their inputs came in.
    """
    stride = torch.empty(tuple(shape), device="meta").stride()
    return DTensor.from_local(local, mesh, placements, run_check=False,  # type: ignore[arg-type]
                              shape=torch.Size(shape), stride=stride)
