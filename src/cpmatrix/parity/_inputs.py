"""The inputs of :func:`check_parity`: drawn once, handed to both sides, mapped back.

Private: cases use :mod:`cpmatrix.parity`'s public names only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from cpmatrix.parity.data import FeatureBatch, distribute
from cpmatrix.parity.dtypes import storage_dtype
from cpmatrix.parity.errors import Check, ParityError
from cpmatrix.parity.trees import flatten, to_full
from cpmatrix.parity.verdict import is_dtensor

__all__ = [
    "Axes",
    "Inputs",
    "Leaf",
    "Placements",
    "TensorSpec",
    "default_placement_note",
    "draw",
    "materialize",
    "output_axes_map",
    "rebuild",
    "serial_layout",
    "tensors_of",
]

Axes = tuple[str | int | None, ...]
#: Per input: placements over the cell's mesh (``[Shard(0), Replicate()]``, ``("S0", "R")``),
#: over named dims of it (``{"cp1": Shard(1)}``: a DTensor on ``cell.mesh["cp1"]``), or None.
Placements = Sequence[Any] | Mapping[str, Any] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorSpec:
    """An activation input: drawn from ``cell.generator`` (or given), identical on all ranks.

    ``shape`` may name symbolic axes of a :class:`FeatureBatch` among the inputs (``"N"``:
    the number of tokens); such dims go through the batch's layout (padding, re-layout)
    on the CP side and come back with :meth:`Layout.to_serial` for the grad comparison.

    Example::

        TensorSpec(shape=("N", 16))                 # tokens x 16, standard normal
        TensorSpec(shape=(7, 4), requires_grad=False)
        TensorSpec.of(my_tensor, axes=("N", None))  # a given serial value
    """

    shape: tuple[int | str, ...]
    dtype: torch.dtype | None = None
    requires_grad: bool = True
    scale: float = 1.0
    value: torch.Tensor | None = None

    @classmethod
    def of(
        cls,
        value: torch.Tensor,
        *,
        axes: Sequence[str | int | None] | None = None,
        requires_grad: bool | None = None,
    ) -> TensorSpec:
        shape = tuple(
            a if isinstance(a, str) else int(value.shape[i])
            for i, a in enumerate(axes or [None] * value.ndim)
        )
        grad = value.is_floating_point() if requires_grad is None else requires_grad
        return cls(shape=shape, dtype=value.dtype, requires_grad=grad, value=value)


@dataclass(slots=True)
class Leaf:
    """A differentiable input: the serial leaf, the CP leaf, and its axes (if laid out)."""

    serial: torch.Tensor
    cp: Any
    axes: Axes | None


@dataclass(slots=True)
class Inputs:
    serial: dict[str, Any] = field(default_factory=dict)
    cp: dict[str, Any] = field(default_factory=dict)
    #: Differentiable inputs by dotted name (``x``, ``batch.tokens``, ``pair.0``).
    leaves: dict[str, Leaf] = field(default_factory=dict)
    batch: FeatureBatch | None = None
    #: Tensor inputs given the default placement (a replicated DTensor), by dotted name.
    defaulted: list[str] = field(default_factory=list)


def draw(
    gen: torch.Generator, shape: Sequence[int], dtype: torch.dtype, device: Any
) -> torch.Tensor:
    """Standard normal in float64 from ``gen`` (same on every rank), then cast."""
    x = torch.randn(tuple(shape), generator=gen, dtype=torch.float64, device=gen.device)
    return x.to(device=device, dtype=dtype)


def find_batch(inputs: Mapping[str, Any]) -> FeatureBatch | None:
    batches = [v for v in inputs.values() if isinstance(v, FeatureBatch)]
    if len(batches) > 1:
        raise ParityError(Check.SETUP, "at most one FeatureBatch among the inputs")
    return batches[0] if batches else None


def _sub_mesh(cell: Any, name: str, places: Mapping[str, Any]) -> tuple[Any, list[Any]]:
    """``{"cp1": Shard(1)}``: the sub-mesh ``cell.mesh["cp1"]`` and its placements."""
    known = tuple(cell.mesh.mesh_dim_names or ())
    unknown = [d for d in places if d not in known]
    if unknown or not places:
        raise ParityError(
            Check.SETUP, f"input {name!r}: placements over mesh dims {list(places)}; the cell's "
                     f"mesh has {list(known)}"
        )
    dims = tuple(places)
    return cell.mesh[dims[0] if len(dims) == 1 else dims], list(places.values())


def rebuild(value: Any, path: str, leaf: Callable[[str, Any], Any]) -> Any:
    """``value`` with every tensor or :class:`TensorSpec` inside replaced by
    ``leaf(dotted path, it)``: through dicts (any ``Mapping``), lists, tuples (named ones
    too) and dataclass instances, each rebuilt as its own type; anything else is kept.

    >>> rebuild({"a": [1, torch.zeros(1)]}, "x", lambda p, t: p)
    {'a': [1, 'x.a.1']}
    """
    if isinstance(value, torch.Tensor | TensorSpec):
        return leaf(path, value)
    if isinstance(value, Mapping):
        items = {k: rebuild(v, f"{path}.{k}", leaf) for k, v in value.items()}
        try:
            return type(value)(items)  # type: ignore[call-arg]
        except TypeError:  # a Mapping that cannot be built from a dict
            return items
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(rebuild(v, f"{path}.{i}", leaf) for i, v in enumerate(value)))
    if isinstance(value, tuple | list):
        return type(value)(rebuild(v, f"{path}.{i}", leaf) for i, v in enumerate(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        new = {f.name: rebuild(getattr(value, f.name), f"{path}.{f.name}", leaf)
               for f in fields}
        out = dataclasses.replace(value, **{f.name: new[f.name] for f in fields if f.init})
        for f in fields:
            if not f.init:  # set by __post_init__ or a default: put the new value back
                object.__setattr__(out, f.name, new[f.name])
        return out
    return value


def _paths(value: Any, path: str) -> list[str]:
    """Every dotted path inside ``value`` (containers and leaves) that placements may name."""
    found = [path]
    rebuild(value, path, lambda p, v: found.append(p))
    if not isinstance(value, torch.Tensor | TensorSpec):
        found.extend(n for n, _ in flatten(value, path))
    return found


def _placement_for(path: str, placements: Mapping[str, Placements]) -> tuple[bool, Placements]:
    """The most specific entry of ``placements`` for ``path`` (``a.b.0``, then ``a.b``,
    then ``a``): ``(True, it)``, or ``(False, None)`` where none names it."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        key = ".".join(parts[:end])
        if key in placements:
            return True, placements[key]
    return False, None


def materialize(
    cell: Any, inputs: Mapping[str, Any], placements: Mapping[str, Placements]
) -> Inputs:
    """Serial and CP keyword arguments, drawn in ``inputs`` order from ``cell.generator``.

    Tensors and :class:`TensorSpec` anywhere inside an input (lists, tuples, dicts,
    dataclasses) are inputs like any other, named by their dotted path (``batch.tokens``):
    each side gets its own copy, and the differentiable ones are compared by their grads.
    ``placements`` may name a leaf by its path, or a container for every leaf inside.
    """
    known: set[str] = set()
    for name, value in inputs.items():
        known.update(_paths(value, name) if not isinstance(value, FeatureBatch) else [name])
    unknown = sorted(set(placements) - known)
    if unknown:
        raise ParityError(Check.SETUP, f"placements for unknown inputs {unknown} "
                                   f"(inputs and their parts: {sorted(known)})")
    out = Inputs(batch=find_batch(inputs))
    for name, value in inputs.items():
        if isinstance(value, FeatureBatch):
            out.serial[name], out.cp[name] = value.serial, value.cp
            continue
        made: dict[str, tuple[Any, Any]] = {}
        out.serial[name] = rebuild(value, name, _maker(cell, placements, out, made, 0))
        out.cp[name] = rebuild(value, name, _maker(cell, placements, out, made, 1))
    return out


def _maker(cell: Any, placements: Mapping[str, Placements], out: Inputs,
           made: dict[str, tuple[Any, Any]], side: int) -> Callable[[str, Any], Any]:
    """The leaf function of :func:`rebuild` for one side: each leaf made once (the first
    side's walk draws, in order), then picked for ``side`` (0 serial, 1 CP)."""
    def leaf(path: str, item: Any) -> Any:
        if path not in made:
            made[path] = _leaf(cell, path, item, placements, out)
        return made[path][side]
    return leaf


def _leaf(
    cell: Any, name: str, value: Any, placements: Mapping[str, Placements], out: Inputs
) -> tuple[Any, Any]:
    """One tensor input: its serial value and its CP value (placed), in ``out.leaves``
    when it takes a grad."""
    from torch.distributed.tensor import Replicate

    if isinstance(value, torch.Tensor) and is_dtensor(value):
        return value, value  # a DTensor given as is: both sides get it
    if isinstance(value, torch.Tensor):
        value = TensorSpec.of(value)
    axes = tuple(a if isinstance(a, str) else None for a in value.shape)
    laid_out = any(isinstance(a, str) for a in value.shape)
    if laid_out and out.batch is None:
        raise ParityError(
            Check.SETUP,
            f"input {name!r} has symbolic axes {value.shape} but "
            f"no FeatureBatch is among the inputs",
        )
    shape = [
        out.batch.axis_size(a) if isinstance(a, str) and out.batch else int(a)
        for a in value.shape
    ]
    dtype = value.dtype or storage_dtype(cell)
    if value.value is not None:
        serial = value.value.detach().to(device=cell.device).clone()
    else:
        serial = draw(cell.generator, shape, dtype, cell.device) * value.scale
    grad = value.requires_grad and (serial.is_floating_point() or serial.is_complex())
    named, places = _placement_for(name, placements)
    if not named:
        places = [Replicate()] * cell.mesh.ndim
        out.defaulted.append(name)
    if places is None:
        cp: Any = serial.detach().clone()
    elif isinstance(places, Mapping):
        if laid_out:
            raise ParityError(Check.SETUP, f"input {name!r}: symbolic axes are laid out over "
                                       f"the cell's whole mesh, not over {list(places)}")
        cp = distribute(serial, *_sub_mesh(cell, name, places))
    elif laid_out and out.batch is not None:
        cp = out.batch.distribute(serial, places, axes)
    else:
        cp = distribute(serial, cell.mesh, places)
    if grad:
        serial.requires_grad_(True)
        cp.requires_grad_(True)
        out.leaves[name] = Leaf(serial, cp, axes if laid_out else None)
    return serial, cp


def default_placement_note(defaulted: Sequence[str]) -> str:
    """What an error of the CP side needs to know about inputs nobody placed.

    >>> default_placement_note(["tokens"])[:62]
    "cpmatrix: the CP side got input ['tokens'] as a replicated DTen"
    """
    first = defaulted[0]
    return (f"cpmatrix: the CP side got input {list(defaulted)} as a replicated DTensor over "
            f"the cell's mesh: the default placement of a tensor input. Pass "
            f"placements={{{first!r}: None}} for a plain tensor (e.g. integer token ids a TP "
            f"plan distributes itself), or the placements your model expects.")


def tensors_of(values: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The tensors among ``values`` (nested mappings, lists, tuples and dataclasses
    flattened to dotted names), names prefixed."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        for path, leaf in flatten(value, f"{prefix}{name}"):
            if isinstance(leaf, torch.Tensor):
                out[path] = leaf
    return out


def output_axes_map(
    output_axes: Mapping[str, Axes] | Axes | None, leaves: Mapping[str, Any]
) -> dict[str, Axes]:
    if output_axes is None:
        return {}
    if isinstance(output_axes, Mapping):
        unknown = sorted(set(output_axes) - set(leaves))
        if unknown:
            raise ParityError(
                Check.SETUP,
                f"output_axes for unknown outputs {unknown} (outputs: {sorted(leaves)})"
            )
        return {k: tuple(v) for k, v in output_axes.items()}
    if len(leaves) != 1:
        raise ParityError(Check.SETUP,
                          f"output_axes as a tuple needs one output, got {sorted(leaves)}")
    return {next(iter(leaves)): tuple(output_axes)}


def serial_layout(ins: Inputs, value: Any, axes: Axes | None) -> Any:
    """A CP value as a full tensor in the serial layout (padding of laid-out axes dropped)."""
    full = to_full(value)
    if axes is None or full is None:
        return full
    if ins.batch is None:
        raise ParityError(Check.SETUP, "output/input axes need a FeatureBatch among the inputs")
    return ins.batch.to_serial(full, axes)
