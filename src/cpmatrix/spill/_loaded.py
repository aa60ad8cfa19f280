"""On a GPU: do the numbers a loaded kernel reports agree with ``ptxas -v``?

Triton fills ``CompiledKernel.n_regs`` and ``n_spills`` only when it loads the cubin on
a device, from ``cuFuncGetAttribute``: ``n_regs`` is ``CU_FUNC_ATTRIBUTE_NUM_REGS`` and
``n_spills`` is ``CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES / 4`` (triton 3.6,
``backends/nvidia/driver.c``). So ``n_spills`` counts *all* per-thread local memory in
4-byte words — the stack frame, spilled or not — and is compared here with ptxas's
stack frame, while the gate itself uses ptxas's spill stores/loads.

Example (on a machine with a CUDA device)::

    >>> crosscheck_loaded(spec)                                   # doctest: +SKIP
    {'device': 'NVIDIA H200', 'arch': 'sm_90a', 'loaded_n_regs': 29, 'ptxas_registers': 29,
     'loaded_n_spills': 0, 'loaded_local_bytes': 0, 'ptxas_stack_frame_bytes': 0, ...,
     'match': True}
    >>> crosscheck_loaded(spec)  # without one                   # doctest: +SKIP
    {'skipped': 'no CUDA device'}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from cpmatrix.spill._measure import compile_kernel, import_triton, load_kernel
from cpmatrix.spill._ptxas import parse_ptxas_log, resolve_ptxas, run_ptxas
from cpmatrix.spill._spec import ARCHS, SpillSpec

__all__ = ["crosscheck_loaded"]

_NOTE = ("Triton's n_spills is CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES / 4: all local memory "
         "(the stack frame) in 4-byte words, not only spills; it is compared with ptxas's "
         "stack frame, not with its spill bytes")


def crosscheck_loaded(spec: SpillSpec, *, search_path: Sequence[str] = (),
                      ptxas: str | None = None) -> dict[str, Any]:
    """Compile ``spec``'s kernel for the current CUDA device, load it, compare with ptxas.

    The kernel is compiled for the device's own arch (what Triton would run there),
    which may differ from ``spec.arch`` (kept as ``spec_arch``). Returns
    ``{"skipped": reason}`` when there is no torch or no CUDA device; raises
    :class:`~cpmatrix.spill.SpillError` when the kernel cannot be compiled.
    """
    try:
        import torch
    except ImportError:
        return {"skipped": "torch not installed"}
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device"}
    major, minor = torch.cuda.get_device_capability()
    capability = 10 * major + minor
    # Triton's sm_arch_from_capability: the "a" variant from sm_90 on.
    arch = f"sm_{capability}{'a' if capability >= 90 else ''}"
    if arch not in ARCHS:
        return {"skipped": f"device arch {arch} is not one of {', '.join(ARCHS)}"}
    device_spec = replace(spec, arch=arch)
    triton = import_triton()
    kernel = load_kernel(spec.kernel, search_path)
    compiled = compile_kernel(triton, kernel.fn, device_spec, capability)
    torch.empty(1, device="cuda")  # make torch's primary context current before loading
    compiled._init_handles()  # cuModuleLoadData + cuFuncGetAttribute: sets n_regs/n_spills
    n_regs, n_spills = int(compiled.n_regs), int(compiled.n_spills)
    log, _ = run_ptxas(resolve_ptxas(arch, ptxas), compiled.asm["ptx"], arch,
                       device_spec.label)
    stats = parse_ptxas_log(log, str(compiled.metadata.name))
    registers_match = n_regs == stats.registers
    local_match = 4 * n_spills == stats.stack_frame_bytes
    return {
        "device": torch.cuda.get_device_name(), "arch": arch, "spec_arch": spec.arch,
        "entry": str(compiled.metadata.name),
        "loaded_n_regs": n_regs, "ptxas_registers": stats.registers,
        "loaded_n_spills": n_spills, "loaded_local_bytes": 4 * n_spills,
        "ptxas_stack_frame_bytes": stats.stack_frame_bytes,
        "ptxas_spill_store_bytes": stats.spill_store_bytes,
        "ptxas_spill_load_bytes": stats.spill_load_bytes,
        "registers_match": registers_match, "local_memory_match": local_match,
        "match": registers_match and local_match, "note": _NOTE,
    }
