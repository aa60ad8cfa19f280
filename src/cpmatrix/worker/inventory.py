"""The inventory: every process-wide setting a cell can change, in one table.

Cells of a world share a Python process, so whatever one case changes reaches the next
cell unless it is put back. This module is the list of what is put back, not a guess:
each :class:`Setting` names one process-wide value, how to read it cheaply (a getter, an
identity, a small tuple; never a deep copy) and either how to **restore** it or why it
can only be **detected** (the cell that changed it fails with check ``process_state``,
and its ranks run no more cells: the next cells rerun in a fresh world).
:class:`Inventory` reads every setting once at world start and, after each cell,
restores what differs and reports what it cannot restore.

The table is :func:`settings`; docs/running.md lists it (a unit test keeps the two in
step). What lives elsewhere, with the same promise: the per-cell environment, working
folder, ``HOME`` and ``TMPDIR`` (:mod:`cpmatrix.worker.cellenv`, set at each cell's
start), module namespaces, classes and ``sys.modules``
(:mod:`cpmatrix.worker.namespaces`), child processes and threads
(:mod:`cpmatrix.worker.isolation`), process groups (:mod:`cpmatrix.worker.hygiene`), and
the RNGs (python, numpy, torch and every cuda device: reseeded from the cell id before
each cell).

Imports only the standard library at import time; torch and numpy are read when the
table is built (inside the worker).

Example::

    >>> import sys
    >>> inv = Inventory([s for s in python_settings() if s.name == "sys.recursionlimit"])
    >>> old = sys.getrecursionlimit(); sys.setrecursionlimit(old + 7)
    >>> inv.after_cell(), sys.getrecursionlimit() == old
    ([], True)
"""

from __future__ import annotations

import contextlib
import gc
import locale
import logging
import os
import signal
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cpmatrix.worker.torch_flags import torch_flags

__all__ = ["Inventory", "Setting", "numpy_settings", "python_settings", "settings",
           "torch_settings"]

Action = Literal["restore", "detect"]


@dataclass(frozen=True, slots=True)
class Setting:
    """One process-wide value: read it; put it back (``write``) or say why not."""

    name: str
    read: Callable[[], Any]
    write: Callable[[Any], object] | None = None
    #: Why a detected setting cannot be put back (shown in the cell's failure).
    why: str = ""

    @property
    def action(self) -> Action:
        return "restore" if self.write is not None else "detect"


# ------------------------------------------------------------------------------- python


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _signals() -> tuple[Any, ...]:
    """Every signal's Python-level handler (None: installed outside Python)."""
    return tuple(signal.getsignal(s) for s in _SIGNALS)


def _set_signals(handlers: tuple[Any, ...]) -> None:
    for sig, handler in zip(_SIGNALS, handlers, strict=True):
        if handler is not None and signal.getsignal(sig) is not handler:
            with contextlib.suppress(OSError, ValueError, TypeError):
                signal.signal(sig, handler)


_SIGNALS = tuple(s for s in signal.valid_signals()
                 if s not in (signal.SIGKILL, signal.SIGSTOP)
                 and isinstance(s, signal.Signals))
_RLIMITS = tuple(getattr(__import__("resource"), n) for n in (
    "RLIMIT_NOFILE", "RLIMIT_STACK", "RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_CORE",
    "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NPROC", "RLIMIT_MEMLOCK")
    if hasattr(__import__("resource"), n))


def _rlimits() -> tuple[tuple[int, int], ...]:
    import resource

    return tuple(resource.getrlimit(r) for r in _RLIMITS)


def _set_rlimits(limits: tuple[tuple[int, int], ...]) -> None:
    import resource

    for r, value in zip(_RLIMITS, limits, strict=True):
        if resource.getrlimit(r) != value:
            resource.setrlimit(r, value)  # raises when a hard limit was lowered: detected


def _timers() -> tuple[tuple[float, float], ...]:
    return tuple(signal.getitimer(t) for t in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL,
                                               signal.ITIMER_PROF))


def _set_timers(values: tuple[tuple[float, float], ...]) -> None:
    for which, (delay, interval) in zip(
            (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF), values,
            strict=True):
        signal.setitimer(which, delay, interval)


def _root_logger() -> tuple[Any, ...]:
    root = logging.getLogger()
    return root.level, tuple(root.handlers), root.disabled, logging.root.manager.disable


def _set_root_logger(value: tuple[Any, ...]) -> None:
    root = logging.getLogger()
    root.setLevel(value[0])
    root.handlers[:] = list(value[1])
    root.disabled = value[2]
    logging.disable(value[3])


def _decimal() -> Any:
    module = sys.modules.get("decimal")
    return None if module is None else module.getcontext().copy()


def _set_decimal(value: Any) -> None:
    if value is not None:
        sys.modules["decimal"].setcontext(value.copy())


def _same_decimal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b or a is None  # decimal first imported by the cell: its defaults
    return bool(repr(a) == repr(b))


def python_settings() -> list[Setting]:
    """The interpreter's and the C library's process-wide settings."""
    s = [
        Setting("sys.recursionlimit", sys.getrecursionlimit, sys.setrecursionlimit),
        Setting("sys.switchinterval", sys.getswitchinterval, sys.setswitchinterval),
        Setting("sys.settrace", sys.gettrace, sys.settrace),
        Setting("sys.setprofile", sys.getprofile, sys.setprofile),
        Setting("threading.settrace", threading.gettrace, threading.settrace),
        Setting("threading.setprofile", threading.getprofile, threading.setprofile),
        Setting("sys.path", lambda: list(sys.path), lambda v: sys.path.__setitem__(
            slice(None), v)),
        Setting("sys.meta_path", lambda: list(sys.meta_path), lambda v: sys.meta_path.__setitem__(
            slice(None), v)),
        Setting("sys.path_hooks", lambda: list(sys.path_hooks),
                lambda v: sys.path_hooks.__setitem__(slice(None), v)),
        Setting("sys.argv", lambda: list(sys.argv), lambda v: sys.argv.__setitem__(
            slice(None), v)),
        Setting("sys.stdin/stdout/stderr", lambda: (sys.stdin, sys.stdout, sys.stderr),
                _set_std_streams),
        Setting("sys.excepthook/displayhook/unraisablehook, threading.excepthook",
                lambda: (sys.excepthook, sys.displayhook, sys.unraisablehook,
                         threading.excepthook), _set_hooks),
        Setting("os.environ (the mapping object)", lambda: os.environ, _set_environ_object),
        Setting("os.umask", _umask, os.umask),
        Setting("signal handlers", _signals, _set_signals),
        Setting("signal mask", lambda: signal.pthread_sigmask(signal.SIG_BLOCK, []),
                lambda v: signal.pthread_sigmask(signal.SIG_SETMASK, v)),
        Setting("interval timers (signal.setitimer, alarm)", _timers, _set_timers),
        Setting("resource limits", _rlimits, _set_rlimits),
        Setting("CPU affinity", lambda: os.sched_getaffinity(0),
                lambda v: os.sched_setaffinity(0, v)),
        Setting("process priority (nice)", lambda: os.getpriority(os.PRIO_PROCESS, 0),
                lambda v: os.setpriority(os.PRIO_PROCESS, 0, v)),
        Setting("locale", lambda: locale.setlocale(locale.LC_ALL),
                lambda v: locale.setlocale(locale.LC_ALL, v)),
        Setting("time zone (time.tzset)", lambda: (time.tzname, time.timezone),
                lambda _v: time.tzset()),
        Setting("socket default timeout", socket.getdefaulttimeout,
                socket.setdefaulttimeout),
        Setting("warnings filters", lambda: list(warnings.filters), _set_warning_filters),
        Setting("logging root logger and logging.disable", _root_logger, _set_root_logger),
        Setting("garbage collector (enabled, thresholds)",
                lambda: (gc.isenabled(), gc.get_threshold()), _set_gc),
        Setting("decimal context", _decimal, _set_decimal),
    ]
    return [_with_compare(x, _same_decimal) if x.name == "decimal context" else x for x in s]


def _set_std_streams(v: tuple[Any, ...]) -> None:
    sys.stdin, sys.stdout, sys.stderr = v


def _set_hooks(v: tuple[Any, ...]) -> None:
    sys.excepthook, sys.displayhook, sys.unraisablehook, threading.excepthook = v


def _set_environ_object(v: Any) -> None:
    os.environ = v  # noqa: B003 - putting back the very mapping a case replaced


def _set_warning_filters(v: list[Any]) -> None:
    warnings.filters[:] = v  # type: ignore[index]  # a list at runtime
    warnings._filters_mutated()  # type: ignore[attr-defined]  # drop the 'once' caches


def _set_gc(v: tuple[bool, tuple[int, ...]]) -> None:
    (gc.enable if v[0] else gc.disable)()
    gc.set_threshold(*v[1])


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {}


def _with_compare(setting: Setting, same: Callable[[Any, Any], bool]) -> Setting:
    _COMPARE[setting.name] = same
    return setting


# -------------------------------------------------------------------------------- torch

#: The device types whose autocast state is kept (those torch knows are read).
_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu", "xla", "ipu", "mtia", "maia",
                     "privateuseone")
#: (backend, op) pairs of torch's fp32 precision settings (torch.backends.*.fp32_precision).
_FP32_PRECISION = (("generic", "all"), ("cuda", "matmul"), ("cuda", "conv"),
                   ("cuda", "rnn"), ("mkldnn", "matmul"), ("mkldnn", "conv"),
                   ("mkldnn", "rnn"))


def torch_settings() -> list[Setting]:
    """torch's process-wide (and main-thread) settings; a getter torch lacks is skipped."""
    import torch

    C: Any = torch._C
    out: list[Setting] = [
        # First: a mode left entered intercepts the torch calls that read the rest.
        Setting("torch function mode stack", C._len_torch_function_stack,
                lambda n: _pop_to(C._len_torch_function_stack, C._pop_torch_function_stack, n)),
        Setting("torch dispatch mode stack", C._len_torch_dispatch_stack,
                lambda n: _pop_to(C._len_torch_dispatch_stack,
                                 lambda: C._pop_torch_dispatch_stack(None), n)),
        Setting("torch infra dispatch modes (fake, proxy, functional)",
                lambda: tuple(C._get_dispatch_mode(k) for k in _infra_keys(C)),
                lambda v: _set_infra_modes(C, v)),
        Setting("torch default dtype", torch.get_default_dtype, torch.set_default_dtype),
        # None removes a device context a case installed; a device re-installs it.
        Setting("torch default device", torch.get_default_device,
                lambda v: torch.set_default_device(None if v.type == "cpu" else v)),
        Setting("torch grad mode", torch.is_grad_enabled, torch.set_grad_enabled),
        Setting("torch inference mode", torch.is_inference_mode_enabled,
                why="inference_mode is a guard object on the C++ stack; it cannot be left "
                "from outside"),
        Setting("torch forward-mode AD", C._is_fwd_grad_enabled, C._set_fwd_grad_enabled),
        Setting("torch deterministic algorithms",
                lambda: (torch.are_deterministic_algorithms_enabled(),
                         torch.is_deterministic_algorithms_warn_only_enabled()),
                lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
        Setting("torch deterministic fill of uninitialized memory",
                C._get_deterministic_fill_uninitialized_memory,
                C._set_deterministic_fill_uninitialized_memory),
        Setting("torch float32 matmul precision", torch.get_float32_matmul_precision,
                torch.set_float32_matmul_precision),
        Setting("torch anomaly mode", lambda: (torch.is_anomaly_enabled(),
                                               torch.is_anomaly_check_nan_enabled()),
                lambda v: torch.autograd.set_detect_anomaly(v[0], check_nan=v[1])),
        Setting("torch intra-op threads", torch.get_num_threads, torch.set_num_threads),
        Setting("torch inter-op threads", torch.get_num_interop_threads,
                why="torch.set_num_interop_threads works once per process"),
        Setting("torch flush denormal", _denormal_probe(torch),
                lambda v: torch.set_flush_denormal(v)),
        Setting("torch function dispatch enabled (DisableTorchFunction)",
                lambda: (C._is_torch_function_enabled(), C._is_torch_function_all_disabled()),
                why="the DisableTorchFunction guards hold C++ state of their own"),
        Setting("torch saved-tensors default hooks",
                lambda: C._autograd._top_saved_tensors_default_hooks(True),
                lambda v: _pop_saved_hooks(C, v)),
        Setting("torch saved-tensors hooks enabled", C._autograd._saved_tensors_hooks_is_enabled,
                lambda v: C._autograd._saved_tensors_hooks_enable() if v else None),
        Setting("torch autograd multithreading", C._is_multithreading_enabled,
                C._set_multithreading_enabled),
        Setting("torch view replay", C._is_view_replay_enabled, C._set_view_replay_enabled),
        Setting("torch warn always", C._get_warnAlways, C._set_warnAlways),
        Setting("torch profiler running", C._autograd._profiler_enabled,
                why="a profiler left running owns its own result; it is not ours to stop"),
        Setting("torch print options", lambda: dict(vars(torch._tensor_str.PRINT_OPTS)),
                lambda v: vars(torch._tensor_str.PRINT_OPTS).update(v)),
        Setting("torch autocast cache", torch.is_autocast_cache_enabled,
                torch.set_autocast_cache_enabled),
    ]
    for device in _AUTOCAST_DEVICES:
        with contextlib.suppress(Exception):
            if torch.amp.is_autocast_available(device):
                out.append(_autocast(torch, device))
    # Every other get/set pair of the installed torch, found at start-up; a pair that
    # does not take its own value back is detected only.
    for name, read, write in torch_flags(torch):
        out.append(_flag(name, read, write))
    for backend, op in _FP32_PRECISION:
        with contextlib.suppress(Exception):
            C._get_fp32_precision_getter(backend, op)
            out.append(_fp32_precision(C, backend, op))
    # Last: modes, inference mode and autocast change these too, and are put back above.
    out.append(Setting(
        "torch dispatch key include/exclude sets",
        lambda: (str(C._dispatch_tls_local_include_set()),
                 str(C._dispatch_tls_local_exclude_set())),
        why="a dispatch key guard left entered lives on the C++ stack"))
    return out


def _flag(name: str, read: Callable[[], Any], write: Callable[[Any], object]) -> Setting:
    """A flag of :func:`torch_flags` (named ``torch flag <getter>``): restored when it
    takes its own value back now, else detected only."""
    try:
        write(read())
    except Exception as exc:
        return Setting(f"torch flag {name}", read,
                       why=f"torch refuses its own value back ({type(exc).__name__})")
    return Setting(f"torch flag {name}", read, write)


def _autocast(torch: Any, device: str) -> Setting:
    def read() -> tuple[bool, Any]:
        return torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)

    def write(value: tuple[bool, Any]) -> None:
        torch.set_autocast_enabled(device, value[0])
        torch.set_autocast_dtype(device, value[1])

    return Setting(f"torch autocast ({device})", read, write)


def _fp32_precision(C: Any, backend: str, op: str) -> Setting:
    return Setting(f"torch.backends fp32_precision ({backend}, {op})",
                   lambda: C._get_fp32_precision_getter(backend, op),
                   lambda v: C._set_fp32_precision_setter(backend, op, v))


def _denormal_probe(torch: Any) -> Callable[[], bool]:
    """Whether the calling thread flushes denormals: torch has no getter, so multiply a
    float32 denormal by one (kept from world start, when flushing is off) and see
    whether it survives. About 10 microseconds."""
    probe = torch.tensor([1e-40], dtype=torch.float32)
    if float(probe[0]) == 0.0:  # the world started flushing: the probe cannot tell
        return lambda: True
    return lambda: bool(float(probe.mul(1.0)[0]) == 0.0)


def _pop_to(length: Callable[[], int], pop: Callable[[], Any], n: int) -> None:
    while length() > n:
        pop()


def _infra_keys(C: Any) -> tuple[Any, ...]:
    key = C._TorchDispatchModeKey
    return tuple(getattr(key, k) for k in ("FAKE", "PROXY", "FUNCTIONAL") if hasattr(key, k))


def _set_infra_modes(C: Any, modes: tuple[Any, ...]) -> None:
    for key, mode in zip(_infra_keys(C), modes, strict=True):
        if C._get_dispatch_mode(key) is not mode:
            C._unset_dispatch_mode(key)
            if mode is not None:
                C._set_dispatch_mode(mode)


def _pop_saved_hooks(C: Any, top: Any) -> None:
    for _ in range(64):  # hooks a case pushed and never popped
        if C._autograd._top_saved_tensors_default_hooks(True) is top:
            return
        C._autograd._pop_saved_tensors_default_hooks()


# -------------------------------------------------------------------------------- numpy


def numpy_settings() -> list[Setting]:
    """numpy's process-wide settings (none when numpy is not installed)."""
    try:
        import numpy as np
    except ImportError:
        return []
    return [
        Setting("numpy error state (seterr)", np.geterr, lambda v: np.seterr(**v)),
        Setting("numpy error callback (seterrcall)", np.geterrcall, np.seterrcall),
        Setting("numpy print options", np.get_printoptions,
                lambda v: np.set_printoptions(**v)),
    ]


def settings() -> list[Setting]:
    """The whole table, in the order it is checked."""
    return [*python_settings(), *torch_settings(), *numpy_settings()]


class Inventory:
    """The table's values at world start; :meth:`after_cell` restores or reports."""

    def __init__(self, table: Sequence[Setting]) -> None:
        self.table: list[Setting] = []
        self.baseline: list[Any] = []
        for setting in table:
            try:
                value = setting.read()
            except Exception:  # not on this platform or this torch: not a setting here
                continue
            self.table.append(setting)
            self.baseline.append(value)

    def after_cell(self) -> list[str]:
        """Put back what differs from world start; what cannot be put back, described."""
        problems: list[str] = []
        for setting, before in zip(self.table, self.baseline, strict=True):
            try:
                now = setting.read()
            except Exception as exc:
                problems.append(f"{setting.name} cannot be read any more ({exc!r})")
                continue
            same = _COMPARE.get(setting.name)
            if (same(before, now) if same else _equal(before, now)):
                continue
            if setting.write is None:
                problems.append(f"the case changed the {setting.name} ({_show(before)} -> "
                                f"{_show(now)}), which cannot be put back: {setting.why}")
                continue
            try:
                setting.write(before)
                if not _equal(before, setting.read()):
                    raise RuntimeError("it did not take")
            except Exception as exc:
                problems.append(f"the case changed the {setting.name} ({_show(before)} -> "
                                f"{_show(now)}) and putting it back failed: {exc!r}")
        return problems


def _equal(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # a value whose == is not a bool
        return False


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
