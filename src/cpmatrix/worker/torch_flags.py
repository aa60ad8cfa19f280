"""torch's process-wide flags, enumerated from the installed torch at start-up.

A hand list of torch settings falls behind the next torch release; this module finds
every get/set pair torch has (runs in the ranks, when the inventory is built):

- ``torch._C``: ``_get_X``/``_set_X`` and ``_jit_get_X``/``_jit_set_X``; a ``_jit_set_X``
  whose getter is named otherwise (``_jit_X``, ``_jit_X_enabled``, ``_jit_is_X``,
  ``_jit_texpr_X``...), and one with no getter that returns the old value (``(arg0:
  bool) -> bool``: the JIT profiling executor and profiling mode), read by setting and
  setting back;
  nvfuser's flags (no-ops since nvfuser left TorchScript, which warn at every read)
  are left out;
- ``torch``: ``get_X``/``set_X``, ``is_X``/``set_X``, ``is_X_enabled``/``set_X_enabled``;
- ``torch.backends.<name>``: module functions ``get_X``/``set_X`` (``mha``'s fast path)
  and the flags its module object exposes as properties (``cudnn.benchmark``, ...).

Each pair becomes a restored setting of the inventory (:mod:`cpmatrix.worker.inventory`),
unless :data:`EXCLUDED` names it with why (the hand table covers it, it takes an
argument, it is deprecated, it has no getter). ``tests/unit/test_torch_flags.py`` scans
the installed torch on its own and fails on a pair that is neither, so a new torch
setting is restored or its exclusion is written down.

Example::

    >>> import torch
    >>> flags = {name for name, _, _ in torch_flags(torch)}
    >>> "torch.backends.mha.get_fastpath_enabled" in flags
    True
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["EXCLUDED", "Flag", "candidates", "torch_flags"]

#: (name: the getter's dotted name, read, write)
Flag = tuple[str, Callable[[], Any], Callable[[Any], object]]

_HAND = "in the inventory's own table (restored there, with what it needs)"
_AUTOCAST = "autocast state: in the inventory's own table, per device type"
_ARGUMENT = "takes an argument: not one process-wide value"
_NO_GETTER = "torch has no getter for it: it can be neither restored nor detected"

#: Pairs (by getter) that are not restored from this module, and why.
EXCLUDED: dict[str, str] = {
    "torch.get_rng_state": "the RNGs are reseeded from the cell id before each cell",
    "torch.get_num_interop_threads": _HAND + " (detected: it can be set once per process)",
    "torch.get_default_dtype": _HAND,
    "torch.get_default_device": _HAND,
    "torch.is_grad_enabled": _HAND,
    "torch.get_num_threads": _HAND,
    "torch.is_anomaly_enabled": _HAND,
    "torch.is_autocast_cache_enabled": _HAND,
    "torch.get_float32_matmul_precision": _HAND,
    "torch.get_deterministic_debug_mode": _HAND + " (torch deterministic algorithms)",
    "torch._C._get_deterministic_algorithms": _HAND + " (torch deterministic algorithms)",
    "torch._C._get_torch_function_state": _HAND + " (detected: the DisableTorchFunction "
                                                 "guards hold C++ state of their own)",
    "torch._C._get_dispatch_mode": _ARGUMENT + " (the dispatch mode key; the hand table "
                                               "covers the infra modes)",
    "torch._C._get_tensor_metadata": _ARGUMENT + " (a tensor)",
    "torch._C._get_value_trace": _ARGUMENT + " (a traced value)",
    "torch.get_autocast_dtype": _AUTOCAST,
    "torch.is_autocast_enabled": _AUTOCAST,
    "torch.get_autocast_cpu_dtype": _AUTOCAST + " (a deprecated alias)",
    "torch.get_autocast_gpu_dtype": _AUTOCAST + " (a deprecated alias)",
    "torch.get_autocast_ipu_dtype": _AUTOCAST + " (a deprecated alias)",
    "torch.get_autocast_xla_dtype": _AUTOCAST + " (a deprecated alias)",
    "torch.is_autocast_cpu_enabled": _AUTOCAST + " (a deprecated alias)",
    "torch.is_autocast_ipu_enabled": _AUTOCAST + " (a deprecated alias)",
    "torch.is_autocast_xla_enabled": _AUTOCAST + " (a deprecated alias)",
    # Setters without a getter (named by the setter): nothing to read.
    "torch._C._jit_set_fusion_strategy": _NO_GETTER + " (it returns the old strategy "
                                                     "only for a new one)",
    "torch._C._jit_set_bailout_depth": "deprecated: setting it replaces the fusion "
                                       "strategy and prints a warning, so it cannot be "
                                       "read by setting it back",
    "torch._C._jit_set_nvfuser_guard_mode": _NO_GETTER,
    "torch._C._jit_set_utf8_decoding_ignore": _NO_GETTER,
    "torch._C._jit_set_logging_stream": _NO_GETTER,
    "torch._C._jit_set_nvfuser_skip_node_kind": _NO_GETTER,
    "torch._C._jit_set_onnx_log_output_stream": _NO_GETTER,
    "torch._C._set_cached_tensors_enabled": _NO_GETTER,
    "torch._C._set_default_mobile_cpu_allocator": _NO_GETTER,
    "torch._C._set_print_stack_traces_on_fatal_signal": _NO_GETTER,
    "torch._C._set_should_use_format_with_string_table": _NO_GETTER,
    "torch._C._set_conj": _ARGUMENT + " (a tensor)",
    "torch._C._set_neg": _ARGUMENT + " (a tensor)",
    "torch._C._set_throw_on_mutable_data_ptr": _ARGUMENT + " (a tensor)",
    "torch._C._set_warn_deprecated_on_mutable_data_ptr": _ARGUMENT + " (a tensor)",
    "torch._C._set_default_dtype": _HAND,
    "torch._C._set_grad_enabled": _HAND,
    "torch._C._set_fp32_precision_setter": _HAND + " (torch.backends fp32_precision)",
    "torch._C._set_default_tensor_type": "deprecated; the default dtype and device it "
                                         "sets are " + _HAND,
    "torch.set_default_tensor_type": "deprecated; the default dtype and device it sets "
                                     "are " + _HAND,
    "torch._C._set_generator_metaclass": "torch's start-up hook, not a setting",
    "torch._C._set_skip_next_torch_function": "a mark for the next call only",
    "torch._C._set_worker_pids": "the DataLoader's worker bookkeeping, not a setting "
                                 "(its workers end with the cell)",
    "torch._C._set_worker_signal_handlers": "the DataLoader's worker bookkeeping, not a "
                                            "setting (its workers end with the cell)",
    "torch.set_flush_denormal": _HAND + " (it has no getter: probed)",
    "torch.set_printoptions": _HAND + " (torch print options)",
    "torch.set_warn_always": _HAND + " (torch warn always)",
    "torch.backends.nnpack.set_flags": "a helper over torch._C._set_nnpack_enabled, "
                                       "which is restored",
}
#: nvfuser left TorchScript: its flags are no-ops that print a warning at every read.
_NVFUSER = "_nvfuser_"

#: A one-argument setter that returns a bool or an int returns the old value.
_SWAP = re.compile(r"^\w+\(arg0: [^,]*\) -> (bool|int)$")
_PROBE = {"bool": True, "int": 1}


def _c_getters(setter: str) -> list[str]:
    """Where torch puts the getter of the ``torch._C`` setter ``setter``."""
    jit = setter.startswith("_jit_")
    base = re.sub(r"^_(jit_)?(texpr_)?set_", "", setter)
    stem = base.removesuffix("_enabled")
    pre = "_jit_" if jit else "_"
    out = [f"{pre}get_{base}", f"{pre}is_{base}", f"{pre}{base}", f"{pre}{stem}_enabled",
           f"{pre}is_{stem}_enabled", f"{pre}get_{stem}_enabled", f"{pre}texpr_{base}"]
    if base.startswith("sdp_use_"):  # _set_sdp_use_flash -> _get_flash_sdp_enabled
        out.append(f"_get_{base.removeprefix('sdp_use_')}_sdp_enabled")
    return out


def candidates(torch: Any) -> Iterator[tuple[str, Any, str, Any, str]]:
    """Every setter of the installed torch with its getter: ``(name, getter, kind,
    setter, how)``. ``name`` is the getter's dotted name (the setter's when there is
    none); ``kind`` is ``pair``, ``swap`` (no getter, but the setter returns the old
    value: ``how`` is its signature) or ``none`` (no getter: ``how`` is the setter)."""
    C = torch._C
    names = set(dir(C))
    for n in sorted(names):
        if not re.match(r"_(jit_(texpr_)?)?set_", n):
            continue
        getter = next((g for g in _c_getters(n) if g in names and g != n), None)
        doc = (getattr(C, n).__doc__ or "").splitlines()
        if getter is not None:
            yield f"torch._C.{getter}", getattr(C, getter), "pair", getattr(C, n), n
        elif doc and _SWAP.match(doc[0]):
            yield f"torch._C.{n}", None, "swap", getattr(C, n), doc[0]
        else:
            yield f"torch._C.{n}", None, "none", getattr(C, n), n
    yield from _module_setters(torch, "torch")
    for info in pkgutil.iter_modules(torch.backends.__path__):
        try:
            module = importlib.import_module(f"torch.backends.{info.name}")
        except Exception:  # a backend this build cannot import: no settings of it here
            continue
        yield from _module_setters(module, f"torch.backends.{info.name}")
        for n, value in sorted(vars(type(module)).items()):
            if type(value).__name__ == "ContextProp":  # torch's PropModule flags
                yield (f"torch.backends.{info.name}.{n}", _prop_get(module, n), "pair",
                       _prop_set(module, n), n)


def _module_setters(module: Any, prefix: str) -> Iterator[tuple[str, Any, str, Any, str]]:
    names = set(dir(module))
    for n in sorted(names):
        if not n.startswith("set_") or not callable(getattr(module, n)):
            continue
        base = n.removeprefix("set_")
        getter = next((g for g in (f"get_{base}", f"is_{base}") if g in names), None)
        if getter is not None:
            yield f"{prefix}.{getter}", getattr(module, getter), "pair", getattr(module, n), n
        else:
            yield f"{prefix}.{n}", None, "none", getattr(module, n), n


def _prop_get(module: Any, name: str) -> Callable[[], Any]:
    return lambda: getattr(module, name)


def _prop_set(module: Any, name: str) -> Callable[[Any], None]:
    return lambda value: setattr(module, name, value)


def _spread(setter: Any) -> Callable[[Any], object]:
    """A setter of a flag whose getter returns a tuple takes it spread (cuBLAS's reduced
    precision reductions: ``(allow, allow_splitk)``)."""
    return lambda value: setter(*value) if isinstance(value, tuple) else setter(value)


def _swap(setter: Any, probe: Any) -> Callable[[], Any]:
    def read() -> Any:
        old = setter(probe)
        setter(old)
        return old
    return read


def torch_flags(torch: Any) -> list[Flag]:
    """The flags the inventory restores: every pair of :func:`candidates` that is not
    in :data:`EXCLUDED` and has a getter (or a setter that returns the old value)."""
    out: list[Flag] = []
    for name, getter, kind, setter, how in candidates(torch):
        if name in EXCLUDED or kind == "none" or _NVFUSER in name:
            continue
        if kind == "swap":
            probe = _PROBE[str(_SWAP.match(how).group(1))]  # type: ignore[union-attr]
            out.append((name, _swap(setter, probe), setter))
        else:
            out.append((name, getter, _spread(setter)))
    return out
