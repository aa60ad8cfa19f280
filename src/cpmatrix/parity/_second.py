"""A second serial sample in the cell's precision, for the tensors one sample cannot judge.

A tensor of a few elements (a bias, a norm's weight) is one or a few draws of the serial
side's rounding, and a sum that cancels to a tenth of its terms rounds, in a different
order, at the *terms'* scale: the serial side (one fp32 accumulation, one rounding at the
value's scale) can be exact where a correct CP side, which rounds two partial sums to the
storage dtype before it reduces them, is 9% off (docs/parity.md, "Tiny tensors"). Nothing
in the tensor's own value tells the two apart. So where the step compares such a tensor,
the serial side runs once more in its own precision in an *equivalent order*: its rows
split into interleaved chunks, each chunk's forward and backward on its own, the parameter
grads accumulated over the chunks as a data-parallel step accumulates them. The
difference between this sample and the twin is a second draw of the rounding noise of
the tensor, at the scale its partial sums really have.

The split is an equivalent order only where the rows are independent (no batch
statistics, no attention over the rows, no dropout): the fp64 twin runs split the same
way first, and only where that equals the twin's own run (to fp64 rounding) is the
low-precision sample taken. Otherwise there is no second sample and ``why`` says so.

Private: cases use :mod:`cpmatrix.parity`'s public names only.

Example::

    >>> torch.arange(5)[_chunks(5, 2)[1]].tolist()
    [1, 3]
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from cpmatrix.parity._inputs import rebuild, tensors_of
from cpmatrix.parity._twin import Twin, buffer_copies, outputs_of, set_buffers
from cpmatrix.parity.compare import POOL_BELOW, Probed
from cpmatrix.parity.dtypes import twin_running
from cpmatrix.parity.verdict import is_dtensor

__all__ = ["SPLIT_MATCH", "Sample", "attach", "needs_second", "row_shards", "second_sample"]

#: The twin run split over rows must equal the whole run within this fraction of each
#: value's largest element (fp64 rounding of a reordered sum is ~1e-16 of its terms).
SPLIT_MATCH = 1e-9

#: outputs, input grads and parameter grads, by name
Values = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    """The second sample's values (float64: exact upcasts of the cell's precision), or why
    there is none (``why``, for the evidence)."""

    values: Values | None
    chunks: int = 0
    why: str = ""

    def line(self) -> str:
        if self.values is None:
            return f"no second serial sample: {self.why}"
        return (f"a second serial sample in the cell's precision, its rows split into "
                f"{self.chunks} interleaved chunks (grads accumulated over them), judges "
                f"the tensors of fewer than {POOL_BELOW} elements and the cancelling ones")


def needs_second(tensors: Mapping[str, Any]) -> bool:
    """Whether any floating tensor compared has fewer than :data:`POOL_BELOW` elements."""
    return any(isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())
               and 0 < t.numel() < POOL_BELOW for t in tensors.values())


def row_shards(cp_inputs: Mapping[str, Any]) -> int:
    """Into how many pieces the CP side splits the rows (the first dim): the largest, over
    its DTensor inputs, product of the mesh sizes over which dim 0 is sharded (1: the CP
    side sums over the rows in one piece, as serial does: no second sample)."""
    most = 1
    for t in tensors_of(dict(cp_inputs), "").values():
        if is_dtensor(t):
            pieces = [t.device_mesh.size(i) for i, p in enumerate(t.placements)
                      if p.is_shard() and getattr(p, "dim", None) == 0]
            most = max(most, math.prod(pieces))
    return most


def _chunks(rows: int, parts: int) -> list[torch.Tensor]:
    """Interleaved row indices: ``parts`` chunks, as many as the CP side's shards of the
    rows (:func:`row_shards`: the same number of partial sums, so the same size of
    rounding) but another partition (so the sample is not the CP side's own rounding)."""
    return [torch.arange(k, rows, parts) for k in range(parts)]


def _rows(values: Sequence[Any]) -> int | None:
    """The common first dim of every tensor in ``values`` (None: none or no common one)."""
    sizes = {t.shape[0] if t.dim() else -1 for t in values if isinstance(t, torch.Tensor)}
    return sizes.pop() if len(sizes) == 1 and min(sizes) >= 2 else None


def _tensors(value: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    rebuild(value, "", lambda _p, t: found.append(t) if isinstance(t, torch.Tensor) else None)
    return found


def _run_split(module: Any, inputs: Mapping[str, Any], leaves: Sequence[str],
               grads: Mapping[str, torch.Tensor], chunks: list[torch.Tensor], rows: int,
               dtype: torch.dtype | None, ctx: Callable[[], Any]) -> Values:
    """``module`` run once per chunk of rows (inputs, grad_outputs cut to it; ``dtype``:
    upcast them to it, None: as they are), outputs and input grads put back in their
    rows, parameter grads accumulated by autograd over the chunks."""
    params = dict(module.named_parameters()) if isinstance(module, torch.nn.Module) else {}
    for p in params.values():
        p.grad = None
    outs: dict[str, torch.Tensor] = {}
    in_grads: dict[str, torch.Tensor] = {}
    for idx in chunks:
        made: dict[str, torch.Tensor] = {}

        def cut(path: str, t: Any, idx: torch.Tensor = idx, made: dict[str, Any] = made) -> Any:
            part = t.detach()[idx.to(t.device)]
            if dtype is not None and (part.is_floating_point() or part.is_complex()):
                part = part.to(torch.complex128 if part.is_complex() else dtype)
            if path in leaves:
                part = part.clone().requires_grad_(True)
                made[path] = part
            return part

        with ctx():
            out = outputs_of(module(**{n: rebuild(v, n, cut) for n, v in inputs.items()}))
        pairs = [(out[n], g[idx.to(g.device)]) for n, g in grads.items()
                 if isinstance(out.get(n), torch.Tensor) and out[n].requires_grad]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs],
                                    [g.to(o.dtype) for o, g in pairs])
        for name, value in [*out.items(), *((n, t.grad) for n, t in made.items())]:
            if not isinstance(value, torch.Tensor):
                continue
            into = outs if name in out else in_grads
            whole = into.setdefault(name, torch.zeros((rows, *value.shape[1:]),
                                                      dtype=torch.float64))
            whole[idx] = value.detach().cpu().to(torch.float64)
    return outs, in_grads, {n: p.grad.detach().cpu().to(torch.float64)
                            for n, p in params.items() if p.grad is not None}


def _mismatch(split: Values, whole: Values) -> str:
    """The first value the split run changed beyond fp64 rounding ("" where none)."""
    for got, want in zip(split, whole, strict=True):
        for name, w in want.items():
            w = w.value if isinstance(w, Probed) else w
            g = got.get(name)
            if not isinstance(w, torch.Tensor) or not w.numel():
                continue
            if g is None or g.shape != w.shape:
                return f"{name}: no value of its shape"
            scale = float(w.detach().abs().max())
            if float((g - w.detach().cpu()).abs().max()) > SPLIT_MATCH * scale:
                return f"{name} differs"
    return ""


def second_sample(serial: Any, start: Mapping[str, torch.Tensor], inputs: Mapping[str, Any],
                  leaves: Sequence[str], outputs: Mapping[str, Any],
                  grads: Mapping[str, torch.Tensor], twin: Twin, parts: int,
                  ctx: Callable[[], Any]) -> Sample:
    """The serial side again in its own precision, its rows in ``parts`` (2 or more:
    :func:`row_shards`) interleaved chunks (``ctx``: the cell's autocast), where the fp64
    twin shows that split is an equivalent order. ``start``: the serial module's buffers
    before its run; both modules' buffers and parameter grads are left as they were."""
    rows = _rows([*_tensors(dict(inputs)), *_tensors(dict(outputs))])
    if rows is None:
        return Sample(None, why="the inputs and outputs share no first dim of 2 or more rows "
                                "to split")
    chunks = _chunks(rows, min(parts, rows))
    mods = [m for m in (serial, twin.module) if isinstance(m, torch.nn.Module)]
    kept = [({n: p.grad for n, p in m.named_parameters()}, buffer_copies(m)) for m in mods]
    try:
        with torch.random.fork_rng(devices=[]), twin_running(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            set_buffers(twin.module, twin.start)
            wide = _run_split(twin.module, inputs, leaves, grads, chunks, rows, torch.float64,
                              contextlib.nullcontext)
            changed = _mismatch(wide, (twin.outputs, twin.input_grads, twin.param_grads))
            if changed:
                return Sample(None, why=f"its rows are not independent (the fp64 twin split "
                                        f"over rows: {changed})")
            set_buffers(serial, start)
            values = _run_split(serial, inputs, leaves, grads, chunks, rows, None, ctx)
    except Exception as exc:  # the toolkit's extra run: never the user's failure
        return Sample(None, why=f"the split run failed ({type(exc).__name__}: {str(exc)[:200]})")
    finally:
        for m, (grads_of, bufs) in zip(mods, kept, strict=True):
            for n, p in m.named_parameters():
                p.grad = grads_of[n]
            set_buffers(m, bufs)
    return Sample(values, len(chunks))


def attach(twin: Twin, sample: Sample) -> None:
    """Each twin value with the second sample of its name (as :class:`Probed`'s
    ``second``)."""
    if sample.values is None:
        return
    for values, seconds in zip((twin.outputs, twin.input_grads, twin.param_grads),
                               sample.values, strict=True):
        for name, v in list(values.items()):
            second = seconds.get(name)
            if second is None or not isinstance(v, torch.Tensor | Probed):
                continue
            base = v if isinstance(v, Probed) else Probed(v, ())
            if second.shape == base.value.shape:
                values[name] = dataclasses.replace(base, second=second)
