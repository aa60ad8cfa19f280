"""Every cell of a world starts from the same process state (runs inside the ranks).

Cells of a world share a Python process, so whatever a case changes reaches the next
cell unless it is put back. :class:`CellIsolation` snapshots the state once, when the
world starts, and after every cell:

- **restores** what can be restored: torch's default dtype and device, grad mode,
  deterministic-algorithm flags, float32 matmul precision, anomaly detection, the CPU
  autocast state, the intra-op thread count; the working directory, ``sys.path``, the
  environment, the ``warnings`` filters; and drops from ``sys.modules`` every module the
  cell imported from the project (the matrix's ``pythonpath`` folders and the bundled
  cases ``cpmatrix.suite``/``cpmatrix.recipes``), so the next cell imports them afresh
  with fresh module state. RNGs are reseeded from the cell id before each cell.
- **detects** what cannot be restored safely: a function or class of ``torch``,
  ``torch.testing``, ``torch.distributed``, ``torch.nn.functional`` or ``torch.Tensor``
  replaced or deleted (a monkeypatched ``assert_close`` would pass the next cell's real
  mismatch); the world's process group destroyed or replaced; inference mode left on.
  The cell that did it fails (check ``process_state``) and the world is recycled: the
  cells after it run in a fresh world.

Imports only the standard library at import time; torch is imported by the worker.

Example (inside the worker)::

    iso = CellIsolation(project_roots=("/repo/tests/cases",))
    for cell in cells:
        iso.before_cell()
        run(cell)
        problems = iso.after_cell()   # state restored; problems mean: recycle the world
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

__all__ = ["WATCHED_MODULES", "CellIsolation"]

#: Modules whose functions and classes a case must not replace (``torch.Tensor`` is a
#: class: its methods are watched the same way).
WATCHED_MODULES = ("torch", "torch.testing", "torch.distributed", "torch.nn.functional",
                   "torch.Tensor")
#: Bundled case packages inside cpmatrix: reloaded like a project's own cases.
_BUNDLED_CASES = ("cpmatrix.suite", "cpmatrix.recipes")


def _namespace(name: str) -> dict[str, Any]:
    import torch

    if name == "torch.Tensor":
        return dict(vars(torch.Tensor))
    module = sys.modules.get(name)
    return dict(vars(module)) if module is not None else {}


def _watchable(value: Any) -> bool:
    """Functions, builtins, classes and descriptors: what a monkeypatch replaces."""
    with warnings.catch_warnings():  # deprecated aliases warn when merely inspected
        warnings.simplefilter("ignore")
        return callable(value) or isinstance(value, classmethod | staticmethod | property)


def _same(before: Any, now: Any) -> bool:
    """``now`` is ``before``, or torch's own wrapper around it.

    torch wraps some of its functions when a submodule is first imported (importing
    ``torch._dynamo`` wraps ``torch.manual_seed`` to keep it out of graphs); such a
    wrapper is defined in a ``torch`` module and leads back to the same function through
    ``__wrapped__``. A case's replacement is defined in the case's module.
    """
    seen = 0
    while now is not before:
        module = getattr(now, "__module__", None) or ""
        if seen > 8 or not module.startswith("torch") or not hasattr(now, "__wrapped__"):
            return False
        now = now.__wrapped__
        seen += 1
    return True


class CellIsolation:
    """Snapshot at world start; :meth:`after_cell` restores and reports what it cannot."""

    def __init__(self, project_roots: Sequence[str]) -> None:
        import torch
        import torch.distributed as dist

        self.roots = tuple(os.path.realpath(p) + os.sep for p in project_roots if p)
        self.cwd = os.getcwd()
        self.sys_path = list(sys.path)
        self.environ = dict(os.environ)
        self.warning_filters = list(warnings.filters)
        self.torch_state = _torch_state()
        self.watched = {name: {k: v for k, v in _namespace(name).items() if _watchable(v)}
                        for name in WATCHED_MODULES}
        self.world_group = dist.group.WORLD if dist.is_initialized() else None
        #: Packages loaded before any cell (torch, numpy, cpmatrix): never dropped, even
        #: when a pythonpath folder holds them; half-reloading torch would break it.
        self.preloaded = {name.partition(".")[0] for name in sys.modules}
        self._modules_before: set[str] = set()
        del torch

    def rebase_world(self) -> None:
        """The world's default group was re-made for another cell size
        (:mod:`cpmatrix.remote.subworld`): it, and the size variables, are the new
        baseline a case must leave in place."""
        import torch.distributed as dist

        self.world_group = dist.group.WORLD if dist.is_initialized() else None
        for key in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
            if key in os.environ:
                self.environ[key] = os.environ[key]

    def before_cell(self) -> None:
        self._modules_before = set(sys.modules)

    def after_cell(self) -> list[str]:
        """Restore the world-start state; return what could not be restored (recycle)."""
        # Restore first: torch rebinds some names itself when its state changes (the
        # default dtype picks ``torch.Storage``), which is not a case's replacement.
        self._restore()
        return self._detect()

    # ----------------------------------------------------------------- detect
    def _detect(self) -> list[str]:
        import torch
        import torch.distributed as dist

        problems = []
        for name, before in self.watched.items():
            now = _namespace(name)
            changed = sorted(k for k, v in before.items() if not _same(v, now.get(k)))
            if changed:
                shown = ", ".join(f"{name}.{k}" for k in changed[:5])
                more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
                problems.append(f"the case replaced or deleted {shown}{more} (a monkeypatch "
                                "left in place would change every later cell's verdict)")
        if self.world_group is not None and (
                not dist.is_initialized() or dist.group.WORLD is not self.world_group):
            problems.append("the case destroyed or replaced the world's process group "
                            "(use the cell's mesh groups; never the default group)")
        if torch.is_inference_mode_enabled():
            problems.append("the case left torch.inference_mode on")
        return problems

    # ---------------------------------------------------------------- restore
    def _restore(self) -> None:
        if os.getcwd() != self.cwd:
            os.chdir(self.cwd)
        sys.path[:] = self.sys_path
        for key in set(os.environ) - set(self.environ):
            del os.environ[key]
        os.environ.update(self.environ)
        warnings.filters[:] = self.warning_filters  # type: ignore[index]  # a list at runtime
        warnings._filters_mutated()  # type: ignore[attr-defined]  # drop the 'once' caches
        _set_torch_state(self.torch_state)
        for name in set(sys.modules) - self._modules_before:
            if self._is_project(name, sys.modules[name]):
                del sys.modules[name]

    def _is_project(self, name: str, module: Any) -> bool:
        if name in _BUNDLED_CASES or name.startswith(tuple(f"{b}." for b in _BUNDLED_CASES)):
            return True
        if name.partition(".")[0] in self.preloaded:
            return False
        file = getattr(module, "__file__", None)
        return isinstance(file, str) and os.path.realpath(file).startswith(self.roots)


def _torch_state() -> dict[str, Any]:
    import torch

    return {
        "default_dtype": torch.get_default_dtype(),
        "default_device": torch.get_default_device(),
        "grad": torch.is_grad_enabled(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "anomaly": torch.is_anomaly_enabled(),
        "anomaly_check_nan": torch.is_anomaly_check_nan_enabled(),
        "cpu_autocast": torch.is_autocast_enabled("cpu"),
        "cpu_autocast_dtype": torch.get_autocast_dtype("cpu"),
        "threads": torch.get_num_threads(),
    }


def _set_torch_state(state: dict[str, Any]) -> None:
    """Put back what differs from ``state`` (and only that: some setters are not free,
    e.g. a default device installs a mode, and must not run after every cell)."""
    import torch

    now = _torch_state()
    if now["default_dtype"] != state["default_dtype"]:
        torch.set_default_dtype(state["default_dtype"])
    if now["default_device"] != state["default_device"]:
        # None removes the device context a case installed; a device re-installs it.
        torch.set_default_device(None if state["default_device"].type == "cpu"
                                 else state["default_device"])
    if now["grad"] != state["grad"]:
        torch.set_grad_enabled(state["grad"])
    if (now["deterministic"], now["deterministic_warn_only"]) != (
            state["deterministic"], state["deterministic_warn_only"]):
        torch.use_deterministic_algorithms(state["deterministic"],
                                           warn_only=state["deterministic_warn_only"])
    if now["matmul_precision"] != state["matmul_precision"]:
        torch.set_float32_matmul_precision(state["matmul_precision"])
    if (now["anomaly"], now["anomaly_check_nan"]) != (state["anomaly"],
                                                      state["anomaly_check_nan"]):
        torch.autograd.set_detect_anomaly(state["anomaly"], check_nan=state["anomaly_check_nan"])
    if now["cpu_autocast"] != state["cpu_autocast"]:
        torch.set_autocast_enabled("cpu", state["cpu_autocast"])
    if now["cpu_autocast_dtype"] != state["cpu_autocast_dtype"]:
        torch.set_autocast_dtype("cpu", state["cpu_autocast_dtype"])
    if now["threads"] != state["threads"]:
        torch.set_num_threads(state["threads"])
