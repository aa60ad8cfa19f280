"""The fp64 twin: the serial model run a second time in float64, on the same weights and
inputs, as the reference the low-precision sides are measured against.

A fixed tolerance cannot fit every computation: a softmax over 8192 values is ~1e-4 per
element (bf16's fixed atol of 0.016 would pass it wrong), and a grad that cancels over 128
tokens differs by ~3e-5 between two correct fp32 summation orders (fp32's fixed atol of
1e-5 would fail it). The twin measures what the serial side's own rounding costs on *this*
computation; :func:`cpmatrix.parity.compare.twin_verdict` then allows the CP side a stated
multiple of it. Derivation of the rule and its factor: docs/parity.md, "The fp64 twin".

Everything here is the toolkit's own run, not the code under test: a twin that cannot run
(a module that cannot be deep-copied, an op without a float64 kernel, an output that is not
float64) is *no twin*, and the fixed table judges instead, labelled so in the evidence.

Private: cases use :mod:`cpmatrix.parity`'s public names only.

Example::

    >>> twin = make_twin(torch.nn.Linear(2, 2))
    >>> twin.why, next(twin.module.parameters()).dtype
    ('', torch.float64)
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from cpmatrix.parity._convert import convert_module
from cpmatrix.parity._inputs import rebuild
from cpmatrix.parity.compare import Probed
from cpmatrix.parity.dtypes import twin_running
from cpmatrix.parity.flips import PROBE_ULPS
from cpmatrix.parity.trees import flatten

__all__ = [
    "PROBE_SEED",
    "PROBE_ULPS",
    "Twin",
    "buffer_copies",
    "make_twin",
    "probe_step",
    "run_probes",
    "set_buffers",
    "upcast",
    "upcast_inputs",
]

#: The probes' random signs come from a generator of their own (the case's draws are
#: never moved), seeded alike for both probes: they are exact opposites.
PROBE_SEED = 20261206


@dataclasses.dataclass(slots=True)
class Twin:
    """The serial side in fp64 (a converted deep copy of a module, or the callable itself),
    or why there is none (``why``). Values it produced are collected by name."""

    module: Any = None
    why: str = ""
    outputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    input_grads: dict[str, Any] = dataclasses.field(default_factory=dict)
    param_grads: dict[str, Any] = dataclasses.field(default_factory=dict)
    buffers: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Why the antithetic probes did not run ("" where they did, or were not asked for).
    probe_why: str = ""
    #: Whether the probes ran and its values are :class:`~cpmatrix.parity.compare.Probed`.
    probed: bool = False
    #: The module's buffers before the twin ran (copies): every probe starts from them, as
    #: the twin's own run did (a forward that updates a running mean must not drift over
    #: the probes' runs).
    start: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.why

    def fail(self, why: str) -> None:
        """No twin from here on: every value judged by the table, labelled with ``why``."""
        if not self.why:
            self.why = why
        self.outputs.clear()
        self.input_grads.clear()
        self.param_grads.clear()
        self.buffers.clear()

    @contextmanager
    def running(self) -> Iterator[None]:
        """Run the twin: the global RNG state is restored after it (the twin must not move
        any draw of the case), DtypeProbes ignore it, its warnings are not the model's
        (not recorded), and an exception of the twin run turns into "no twin" (the fixed
        table judges) instead of failing the check."""
        if not self.ok:
            yield
            return
        try:
            with torch.random.fork_rng(devices=[]), twin_running(), \
                    warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield
        except Exception as exc:  # the toolkit's extra run: never the user's failure
            first = str(exc).splitlines()[0] if str(exc) else ""
            self.fail(f"the serial side does not run in float64 ({type(exc).__name__}: "
                      f"{first[:200]})")


def make_twin(serial: Any) -> Twin:
    """A float64 copy of ``serial`` (a module: deep-copied, then converted with
    :func:`~cpmatrix.parity._convert.convert_module`; a callable: itself)."""
    if not isinstance(serial, torch.nn.Module):
        return Twin(module=serial)
    try:
        twin = copy.deepcopy(serial)
    except Exception as exc:  # a module holding a lock, a process group, a file...
        return Twin(why=f"the serial module cannot be deep-copied ({type(exc).__name__}: "
                        f"{str(exc)[:200]})")
    device = next((t.device for t in (*serial.parameters(), *serial.buffers())), "cpu")
    convert_module(twin, dtype=torch.float64, device=device)
    for p in twin.parameters():
        p.grad = None
    return twin_of(twin)


def twin_of(module: torch.nn.Module) -> Twin:
    return Twin(module=module, start=buffer_copies(module))


def buffer_copies(module: Any) -> dict[str, torch.Tensor]:
    """Detached copies of a module's buffers by name (none for a plain callable): a
    snapshot later runs cannot move."""
    if not isinstance(module, torch.nn.Module):
        return {}
    return {n: b.detach().clone() for n, b in module.named_buffers()}


def set_buffers(module: Any, values: Mapping[str, torch.Tensor]) -> None:
    """Put ``values`` back into the module's buffers of those names: in place where the
    shape still fits (a buffer shared by two submodules stays shared), else as a new
    tensor (a forward that replaced or grew it).

    >>> bn = torch.nn.BatchNorm1d(2)
    >>> start = buffer_copies(bn)
    >>> _ = bn(torch.randn(4, 2))
    >>> set_buffers(bn, start); bn.running_mean.tolist()
    [0.0, 0.0]
    """
    if not isinstance(module, torch.nn.Module):
        return
    with torch.no_grad():
        for name, value in values.items():
            owner, _, leaf = name.rpartition(".")
            sub = module.get_submodule(owner)
            current = sub._buffers.get(leaf)
            if current is not None and current.shape == value.shape:
                current.copy_(value)
            else:
                sub._buffers[leaf] = value.clone()


def upcast(value: Any) -> Any:
    """``value`` with every floating tensor inside as float64 and every complex one as
    complex128 (detached copies; exact: every lower precision embeds in them); others as
    they are."""
    def up(_path: str, t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if t.is_floating_point():
            return t.detach().to(torch.float64)
        if t.is_complex():
            return t.detach().to(torch.complex128)
        return t
    return rebuild(value, "", up)


def upcast_inputs(
    serial_inputs: Mapping[str, Any], leaves: Sequence[str]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The twin's keyword arguments, and its differentiable inputs by the same dotted names
    as the serial side's (``leaves``), each a float64 leaf that takes a grad."""
    grads: dict[str, torch.Tensor] = {}

    def up(path: str, t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if not (t.is_floating_point() or t.is_complex()):
            return t
        wide = t.detach().to(torch.complex128 if t.is_complex() else torch.float64)
        if path in leaves:
            wide.requires_grad_(True)
            grads[path] = wide
        return wide

    out = {name: rebuild(value, name, up) for name, value in serial_inputs.items()}
    return out, grads


def outputs_of(value: Any) -> dict[str, Any]:
    """The twin's outputs by the names :func:`~cpmatrix.parity.trees.flatten` gives."""
    return dict(flatten(value))


def backward_twin(outs: Mapping[str, Any], grads: Mapping[str, torch.Tensor]) -> None:
    """Backward the twin's outputs with the serial side's grad_outputs, upcast."""
    tensors = [outs[n] for n in grads if isinstance(outs.get(n), torch.Tensor)
               and outs[n].requires_grad]
    wide = [grads[n].detach().to(outs[n].dtype) for n in grads
            if isinstance(outs.get(n), torch.Tensor) and outs[n].requires_grad]
    if tensors:
        torch.autograd.backward(tensors, wide)


def probe_step(t: torch.Tensor, sign: float, step: float, gen: torch.Generator,
               *, absolute: bool = False) -> torch.Tensor:
    """``t`` moved by ``sign * step * |t|`` (``absolute``: ``sign * step * rms(t)``, the
    rounding a sum's result takes at the scale of its terms, which a value near 0 does
    not show) with a random sign per element from ``gen`` (the same draws for both
    probes: exact opposites).

    >>> t = torch.tensor([0.0, 2.0], dtype=torch.float64)
    >>> plus = probe_step(t, 1.0, 0.5, torch.Generator().manual_seed(0))
    >>> minus = probe_step(t, -1.0, 0.5, torch.Generator().manual_seed(0))
    >>> (plus + minus).tolist(), (plus - t).abs().tolist()
    ([0.0, 4.0], [0.0, 1.0])
    """
    signs = torch.randint(0, 2, t.shape, generator=gen).to(t.device, t.dtype) * 2 - 1
    size = (t.detach().square().mean().sqrt() if absolute and t.numel()
            else t.detach().abs())
    return t + sign * step * size * signs


def _stepper(sign: float, step: float, gen: torch.Generator, *,
             absolute: bool = False) -> Callable[[str, Any], Any]:
    """A :func:`~cpmatrix.parity._inputs.rebuild` leaf that moves every floating tensor by
    a probe step and keeps anything else."""
    def leaf(_path: str, t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return probe_step(t, sign, step, gen, absolute=absolute)
        return t
    return leaf


@contextmanager
def _probing(module: Any, sign: float, step: float, gen: torch.Generator) -> Iterator[None]:
    """Every submodule's floating outputs moved by a probe step while inside (forward
    hooks, removed after): the rounding each layer's output takes on the serial side."""
    handles = []
    if isinstance(module, torch.nn.Module):
        step_out = _stepper(sign, step, gen, absolute=True)

        def hook(_m: Any, _args: Any, out: Any) -> Any:
            return rebuild(out, "", step_out)
        handles = [m.register_forward_hook(hook) for m in module.modules()]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def run_probes(twin: Twin, t_ins: Mapping[str, Any], leaves: Sequence[str],
               s_grads: Mapping[str, torch.Tensor], eps: float) -> None:
    """Run the twin four times more, its inputs and every module's outputs moved by
    ``+d`` and ``-d`` (``d = PROBE_ULPS * eps`` times the value, or the rms of a module's
    output; two patterns of random signs; the second pair moves the module outputs alone:
    an input step and an output step in one probe can cancel at a pre-activation near 0,
    in both pairs, and a flip the serial side took would go unseen), and wrap each of
    its values
    as :class:`~cpmatrix.parity.compare.Probed`: an element whose decision (a ReLU mask, a
    top-k routing) the cell's rounding can flip jumps under one of the probes.

    Each probe starts from the module's buffers as the twin's run did (``twin.start``),
    and the buffers are left as the twin's run left them: a forward that updates state
    (a running mean) would otherwise flag every element it touches as a jump and move the
    twin's buffers off the reference. State kept outside buffers is not restored.

    A probe that cannot run leaves the values unprobed (``probe_why`` says why): they are
    judged as without probes, never failed for it."""
    if not twin.ok:
        return
    step = PROBE_ULPS * eps
    runs: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = []
    params = dict(twin.module.named_parameters()) \
        if isinstance(twin.module, torch.nn.Module) else {}
    kept = {n: p.grad for n, p in params.items()}
    after = buffer_copies(twin.module)
    try:
        for pattern, sign in ((0, 1.0), (0, -1.0), (1, 1.0), (1, -1.0)):
            gen = torch.Generator().manual_seed(PROBE_SEED + pattern)
            set_buffers(twin.module, twin.start)
            for p in params.values():
                p.grad = None
            ins, grads = upcast_inputs(t_ins, list(leaves))
            if pattern == 0 or not isinstance(twin.module, torch.nn.Module):
                ins = {n: rebuild(v, n, _stepper(sign, step, gen)) for n, v in ins.items()}
            with torch.random.fork_rng(devices=[]), twin_running(), \
                    warnings.catch_warnings(), _probing(twin.module, sign, step, gen):
                warnings.simplefilter("ignore")
                out = outputs_of(twin.module(**ins))
                backward_twin(out, s_grads)
            runs.append(({n: v.detach() for n, v in out.items() if isinstance(v, torch.Tensor)},
                         {n: t.grad for n, t in grads.items()},
                         {n: p.grad for n, p in params.items()}))
    except Exception as exc:  # the toolkit's extra run: never the user's failure
        twin.probe_why = f"the probes did not run ({type(exc).__name__}: {str(exc)[:200]})"
        return
    finally:
        for n, p in params.items():
            p.grad = kept[n]
        set_buffers(twin.module, after)
    twin.outputs = _probed(twin.outputs, [r[0] for r in runs])
    twin.input_grads = _probed(twin.input_grads, [r[1] for r in runs])
    twin.param_grads = _probed(twin.param_grads, [r[2] for r in runs])
    twin.probed = True


def _probed(values: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each value with its probes (one per run), where every probe has a tensor of its
    shape."""
    out: dict[str, Any] = {}
    for name, v in values.items():
        probes = tuple(run.get(name) for run in runs)
        fits = all(isinstance(x, torch.Tensor) and x.shape == v.shape for x in (v, *probes))
        out[name] = Probed(v, probes) if fits else v  # type: ignore[arg-type]
    return out


Factory = Callable[[Any], Any]
