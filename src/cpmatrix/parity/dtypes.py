"""Make the dtypes a Function or module really computes in observable, and assert them.

End-to-end parity is vacuous against a cast inserted and reverted inside one Function:
an fp64 path that secretly computes in fp32 still matches fp64 serial to ~1e-7 on small
inputs. :class:`DtypeProbe` records, for each watched module or ``autograd.Function``:
the dtypes of its floating inputs, whether autocast was on (and its dtype), the phase
(``forward``, or ``recompute`` when ``checkpoint(use_reentrant=False)`` re-runs it inside
backward), and with ``ops=True`` the dtypes every aten op inside it ran in.

Modules are watched with forward **pre**-hooks: a post-hook can miss the recompute pass,
which stops early once the tensors it needs are rebuilt.

Example::

    >>> import torch
    >>> from torch.utils.checkpoint import checkpoint
    >>> lin = torch.nn.Linear(4, 4).double()
    >>> with DtypeProbe(ops=True) as probe:
    ...     _ = probe.watch(lin, "lin")
    ...     y = checkpoint(lin, torch.randn(2, 4, dtype=torch.float64, requires_grad=True),
    ...                    use_reentrant=False)
    ...     y.sum().backward()
    >>> [e.phase for e in probe.events_for("lin")]
    ['forward', 'recompute']
    >>> assert_autocast_off(probe, "lin", torch.float64, require_recompute=True)
    ["lin forward: ['torch.float64']", "lin recompute: ['torch.float64']"]
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import torch

from cpmatrix.parity.errors import Check, DtypePathError, odd_input_fails

__all__ = [
    "COMPUTE_OPS",
    "DtypeEvent",
    "DtypeProbe",
    "assert_autocast_off",
    "assert_autocast_on",
    "assert_compute_dtype",
    "autocast_ctx",
    "expected_compute_dtype",
    "storage_dtype",
    "twin_running",
]

#: Set while ``check_parity`` runs its fp64 twin: probes do not record the toolkit's own
#: extra run of the serial side (it is float64 and never under autocast by design).
_TWIN: contextvars.ContextVar[bool] = contextvars.ContextVar("cpmatrix_twin", default=False)


@contextlib.contextmanager
def twin_running() -> Iterator[None]:
    """Inside, :class:`DtypeProbe` records nothing: the fp64 twin is not the code under test.

    >>> ident = torch.nn.Identity()
    >>> with DtypeProbe() as probe:
    ...     _ = probe.watch(ident, "id")
    ...     with twin_running():
    ...         _ = ident(torch.ones(1))
    >>> probe.events
    []
    """
    token = _TWIN.set(True)
    try:
        yield
    finally:
        _TWIN.reset(token)

#: Aten ops whose input dtypes are "the compute dtype" (matmul-like: what autocast casts).
COMPUTE_OPS: Final = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "matmul",
    "linear",
    "convolution",
    "scaled_dot_product",
    "einsum",
    "dot",
    "mv",
)


@dataclass(slots=True)
class DtypeEvent:
    """One call of a watched module/Function."""

    name: str
    phase: str
    inputs: tuple[torch.dtype, ...]
    autocast: bool
    autocast_dtype: torch.dtype | None
    ops: list[tuple[str, tuple[torch.dtype, ...]]] = field(default_factory=list)

    def compute_dtypes(self) -> set[torch.dtype]:
        """Dtypes of the matmul-like ops inside, else of every non-copy op (needs ``ops=True``)."""
        matmul = {d for op, dts in self.ops if any(k in op for k in COMPUTE_OPS) for d in dts}
        if matmul:
            return matmul
        # Casts are how a dtype changes, not where compute happens: skip them.
        return {d for op, dts in self.ops if "copy" not in op and ".to." not in op for d in dts}


def _in_backward() -> bool:
    # The recompute of checkpoint(use_reentrant=False) runs inside the autograd engine.
    task = getattr(torch._C, "_current_graph_task_id", None)
    return bool(task is not None and task() != -1)


def _floating(values: Sequence[Any]) -> tuple[torch.dtype, ...]:
    return tuple(v.dtype for v in values if isinstance(v, torch.Tensor) and v.is_floating_point())


class DtypeProbe:
    """Records compute dtypes of watched modules / autograd.Functions (a context manager)."""

    def __init__(self, *, ops: bool = False, device_type: str = "cpu") -> None:
        self.record_ops = ops
        self.device_type = device_type
        self.events: list[DtypeEvent] = []
        self._open: list[DtypeEvent] = []
        self._undo: list[Callable[[], None]] = []
        self._mode: Any = None

    def __enter__(self) -> DtypeProbe:
        if self.record_ops:
            self._mode = _op_recorder(self)
            self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def _begin(self, name: str, args: Sequence[Any]) -> DtypeEvent:
        on = torch.is_autocast_enabled(self.device_type)
        event = DtypeEvent(
            name=name,
            phase="recompute" if _in_backward() else "forward",
            inputs=_floating(args),
            autocast=on,
            autocast_dtype=torch.get_autocast_dtype(self.device_type) if on else None,
        )
        if not _TWIN.get():
            self.events.append(event)
            self._open.append(event)
        return event

    def _end(self, event: DtypeEvent) -> None:
        if event in self._open:
            self._open.remove(event)

    def watch(self, module: torch.nn.Module, name: str | None = None) -> DtypeProbe:
        """Watch a module with a forward pre-hook (and an always-called post-hook that only
        closes the op scope)."""
        label = name or type(module).__name__
        opened: list[DtypeEvent] = []

        def pre(_mod: torch.nn.Module, args: tuple[Any, ...]) -> None:
            opened.append(self._begin(label, args))

        def post(_mod: torch.nn.Module, _args: Any, _out: Any) -> None:
            if opened:
                self._end(opened.pop())

        handles = [
            module.register_forward_pre_hook(pre),
            module.register_forward_hook(post, always_call=True),
        ]

        def remove() -> None:
            for handle in handles:
                handle.remove()

        self._undo.append(remove)
        return self

    def watch_function(
        self, fn_cls: type[torch.autograd.Function], name: str | None = None
    ) -> DtypeProbe:
        """Watch an ``autograd.Function`` by wrapping its ``forward`` (restored on exit)."""
        label = name or fn_cls.__name__
        original = fn_cls.__dict__["forward"]
        forward = original.__func__ if isinstance(original, staticmethod) else original

        @functools.wraps(forward)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            event = self._begin(label, args)
            try:
                return forward(*args, **kwargs)
            finally:
                self._end(event)

        fn_cls.forward = staticmethod(wrapped)  # type: ignore[method-assign]
        self._undo.append(lambda: setattr(fn_cls, "forward", original))
        return self

    def events_for(self, name: str, phase: str | None = None) -> list[DtypeEvent]:
        return [e for e in self.events if e.name == name and (phase is None or e.phase == phase)]


def _op_recorder(probe: DtypeProbe) -> Any:
    # A dispatch mode sees every aten op *after* autocast has cast its inputs: the dtype the
    # kernel really runs in. Private torch API, isolated here (torch.utils._python_dispatch).
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Ops(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            if probe._open:
                flat = [*args, *(kwargs or {}).values()]
                probe._open[-1].ops.append((str(func), _floating(flat)))
            return func(*args, **(kwargs or {}))

    return _Ops()  # type: ignore[no-untyped-call]


_REDUCED = (torch.bfloat16, torch.float16)


def storage_dtype(cell: Any) -> torch.dtype:
    """The dtype parameters and inputs are held in for a cell.

    An autocast cell (``autocast=on``, ``dtype`` bf16/fp16) is mixed precision: weights and
    inputs stay float32 and the forward runs under ``torch.autocast(dtype=cell.dtype)``.
    Every other cell holds everything in ``cell.dtype``.

    Example::

        >>> from types import SimpleNamespace
        >>> storage_dtype(SimpleNamespace(dtype=torch.bfloat16, autocast=True))
        torch.float32
    """
    dtype: torch.dtype = cell.dtype
    if cell.autocast and dtype in _REDUCED:
        return torch.float32
    return dtype


def autocast_ctx(cell: Any) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` to the cell's reduced dtype (or the device default) when on."""
    if not cell.autocast:
        return contextlib.nullcontext()
    device_type = torch.device(cell.device).type
    if cell.dtype in _REDUCED:
        return torch.autocast(device_type=device_type, dtype=cell.dtype)
    return torch.autocast(device_type=device_type)


def expected_compute_dtype(
    dtype: torch.dtype, autocast: bool, device_type: str = "cpu"
) -> torch.dtype:
    """The dtype matmul-like ops should run in for a cell.

    Autocast leaves float64 alone (it is not an eligible dtype) and casts float32 to the
    device's autocast dtype (bf16 on CPU, fp16 on CUDA by default).

    Example::

        >>> expected_compute_dtype(torch.float32, True)
        torch.bfloat16
        >>> expected_compute_dtype(torch.float64, True)
        torch.float64
    """
    if autocast and dtype == torch.float32:
        return torch.get_autocast_dtype(device_type)
    return dtype


def _events(probe: DtypeProbe, name: str, require_recompute: bool) -> list[DtypeEvent]:
    events = probe.events_for(name)
    if not events:
        raise DtypePathError(f"dtype_path: {name!r} never ran while watched (vacuous)")
    if require_recompute and not probe.events_for(name, "recompute"):
        raise DtypePathError(
            f"dtype_path: {name!r} has no recompute pass: was it run under "
            f"checkpoint(use_reentrant=False) and backpropagated?"
        )
    return events


def assert_compute_dtype(
    probe: DtypeProbe, name: str, expected: torch.dtype, *, require_recompute: bool = False
) -> list[str]:
    """Every call of ``name`` (forward and recompute) computed in ``expected``.

    With ``ops=True`` the matmul-like ops inside are checked (the truth, after autocast);
    without, the floating inputs. Returns evidence lines.
    """
    with odd_input_fails(Check.DTYPE_PATH):
        lines = []
        for event in _events(probe, name, require_recompute):
            seen = event.compute_dtypes() if probe.record_ops else set(event.inputs)
            if probe.record_ops and not seen:
                seen = set(event.inputs)
            wrong = sorted(str(d) for d in seen if d != expected)
            if wrong:
                where = "ops inside" if probe.record_ops else "inputs"
                raise DtypePathError(
                    f"dtype_path: {name!r} {event.phase}: {where} ran in {wrong}, "
                    f"expected {expected} (a hidden cast?)"
                )
            lines.append(f"{name} {event.phase}: {sorted(str(d) for d in seen)}")
        return lines


def assert_autocast_off(
    probe: DtypeProbe, name: str, dtype: torch.dtype, *, require_recompute: bool = False
) -> list[str]:
    """Autocast was off in every call of ``name`` and it computed in ``dtype``."""
    with odd_input_fails(Check.DTYPE_PATH):
        for event in _events(probe, name, require_recompute):
            if event.autocast:
                raise DtypePathError(
                    f"dtype_path: {name!r} {event.phase} ran under autocast "
                    f"({event.autocast_dtype}) in an autocast-off cell"
                )
        return assert_compute_dtype(probe, name, dtype, require_recompute=require_recompute)


def assert_autocast_on(
    probe: DtypeProbe,
    name: str,
    *,
    dtype: torch.dtype = torch.float32,
    require_recompute: bool = False,
) -> list[str]:
    """Autocast was on in every call (recompute included) and matmul-like ops ran in the
    autocast dtype (for ``dtype`` inputs; see :func:`expected_compute_dtype`)."""
    with odd_input_fails(Check.DTYPE_PATH):
        events = _events(probe, name, require_recompute)
        for event in events:
            if not event.autocast:
                raise DtypePathError(
                    f"dtype_path: {name!r} {event.phase} ran with autocast OFF in an "
                    f"autocast-on cell (state not restored for the recompute?)"
                )
        if not probe.record_ops:
            return [f"{name} {e.phase}: autocast on ({e.autocast_dtype})" for e in events]
        return assert_compute_dtype(
            probe,
            name,
            expected_compute_dtype(dtype, True, probe.device_type),
            require_recompute=require_recompute,
        )
