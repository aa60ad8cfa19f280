"""Register-spill gates for Triton kernels that run without a GPU.

A kernel that spills registers to local memory is slow while every parity test stays
green. A spill gate compiles a ``@triton.jit`` kernel ahead of time for a GPU arch
(no GPU needed), runs the ``ptxas -v`` that ships with Triton on its PTX, and fails
if the kernel spills more than a budget (default: nothing).

Modules, one concept each:

* :mod:`._spec` — :class:`SpillSpec` (what to compile), :data:`ARCHS`, :class:`SpillError`;
* :mod:`._ptxas` — finding and running ptxas, parsing ``-v`` (:func:`parse_ptxas_log`);
* :mod:`._report` — :class:`SpillReport` and its :class:`SpillVerdict`;
* :mod:`._measure` — :func:`compile_and_measure`, its digest and cache;
* :mod:`._loaded` — :func:`crosscheck_loaded`, the on-GPU check of ptxas's numbers.

Importing this package imports neither torch nor triton.

Example::

    >>> from cpmatrix.spill import SpillSpec, compile_and_measure          # doctest: +SKIP
    >>> spec = SpillSpec(kernel="cpmatrix.suite.kernels.softmax:softmax_bwd_kernel",
    ...                  signature={"y_ptr": "*fp32", "dy_ptr": "*fp32", "dx_ptr": "*fp32",
    ...                             "n_cols": "i32", "y_stride": "i32", "dy_stride": "i32",
    ...                             "dx_stride": "i32", "BLOCK": "constexpr"},
    ...                  constexprs={"BLOCK": 1024}, arch="sm_90a")
    >>> report = compile_and_measure(spec, cache_dir=None)
    >>> report.verdict()
    SpillVerdict(passed=True, message='spilled 0 bytes stores + 0 bytes loads <= budget 0 ...')
"""

from cpmatrix.spill._loaded import crosscheck_loaded
from cpmatrix.spill._measure import (
    LoadedKernel,
    autotune_specs,
    compile_and_measure,
    import_triton,
    load_kernel,
    spill_digest,
)
from cpmatrix.spill._ptxas import Ptxas, PtxasStats, parse_ptxas_log, resolve_ptxas, run_ptxas
from cpmatrix.spill._report import SpillReport, SpillVerdict
from cpmatrix.spill._spec import (
    ARCHS,
    ConstexprValue,
    SpillError,
    SpillSpec,
    spec_for_cell,
    specs_from_table,
)

__all__ = [
    "ARCHS",
    "ConstexprValue",
    "LoadedKernel",
    "Ptxas",
    "PtxasStats",
    "SpillError",
    "SpillReport",
    "SpillSpec",
    "SpillVerdict",
    "autotune_specs",
    "compile_and_measure",
    "crosscheck_loaded",
    "import_triton",
    "load_kernel",
    "parse_ptxas_log",
    "resolve_ptxas",
    "run_ptxas",
    "spec_for_cell",
    "specs_from_table",
    "spill_digest",
]
