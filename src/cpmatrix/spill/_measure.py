"""Compile a :class:`SpillSpec` ahead of time, measure it with ptxas, cache the result.

No GPU is needed: Triton compiles for a ``GPUTarget`` given explicitly, and the ptxas
in Triton's wheel reports registers and spills for the PTX.

Triton 3.6 calls used here (read from its source):

* ``triton.compiler.ASTSource(fn=jit_fn, signature={name: type, ...},
  constexprs={name: value})`` — constexpr values go in ``constexprs`` (keyed by
  parameter name) *and* their signature type is the string ``"constexpr"``;
* ``triton.compile(src, target=GPUTarget("cuda", capability, 32),
  options={"num_warps": ..., "num_stages": ..., "maxnreg": ...})`` — options are the
  ``CUDAOptions`` field names; the result's ``.asm["ptx"]`` is the PTX,
  ``.metadata.name`` the entry function and ``.metadata.shared`` the dynamic shared
  memory. ``n_regs``/``n_spills`` stay unset until the kernel is loaded on a GPU.

The same calls work on every Triton of pyproject's ``kernels`` range (3.6 to 3.9), with one
adapter: Triton 3.9 warns at every compile that leaves ``enable_fp_fusion`` unset (its
default flips in 3.10), so the option is passed explicitly, set to the installed Triton's
own default (see ``_fp_fusion_default``).

Not thread-safe: compiling points Triton's global cache setting at a private temporary
folder (so ``compile_seconds`` is a real compile and ``~/.triton`` stays untouched).
Run gates in parallel processes, not threads.

Example::

    >>> spec = SpillSpec(kernel="spill_kernels:row_softmax",               # doctest: +SKIP
    ...                  signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "n_cols": "i32",
    ...                             "stride": "i32", "BLOCK": "constexpr"},
    ...                  constexprs={"BLOCK": 1024}, arch="sm_90a")
    >>> report = compile_and_measure(spec, cache_dir=Path(".cache/spill"),  # doctest: +SKIP
    ...                              search_path=["tests/resources"])
    >>> report.verdict().message                                           # doctest: +SKIP
    'spilled 0 bytes stores + 0 bytes loads <= budget 0 (registers 29, stack 0)'
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.machinery
import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cpmatrix.digest import canonical_json, sha256_hex
from cpmatrix.fsutil import atomic_write_json, atomic_write_text
from cpmatrix.spill._ptxas import (
    Ptxas,
    PtxasStats,
    parse_ptxas_log,
    resolve_ptxas,
    retarget_ptx,
    run_ptxas,
    summarize,
)
from cpmatrix.spill._report import SpillReport
from cpmatrix.spill._spec import SpillError, SpillSpec

__all__ = ["LoadedKernel", "autotune_specs", "compile_and_measure", "import_triton",
           "load_kernel", "spill_digest"]

#: Bump when the cache entry's layout or meaning changes: old entries then miss.
_CACHE_SCHEMA = 1

#: sha256 of each module's source when this process last (re)imported it for a gate,
#: so an edited module is re-imported instead of compiling its stale functions.
_IMPORTED: dict[str, str] = {}


def import_triton() -> Any:
    """``triton``, or a :class:`SpillError` that says how to install it."""
    try:
        import triton
        import triton.compiler
    except ImportError as e:
        raise SpillError("triton is not installed; spill gates need it: "
                         "pip install cpmatrix[kernels]") from e
    return triton


@dataclass(frozen=True, slots=True)
class LoadedKernel:
    """A kernel's ``@triton.jit`` function and what its digest needs."""

    fn: Any  # triton.runtime.JITFunction
    wrapper: Any  # what module:attr named (the JITFunction, or an Autotuner around it)
    source_sha256: str  # of the module file the function came from
    origin: str


@contextlib.contextmanager
def _path_first(search_path: Sequence[str]) -> Iterator[None]:
    saved = list(sys.path)
    sys.path[:0] = [os.fspath(p) for p in search_path]
    try:
        yield
    finally:
        sys.path[:] = saved


def load_kernel(kernel: str, search_path: Sequence[str] = ()) -> LoadedKernel:
    """Import ``module:attr`` (``search_path`` first on ``sys.path``) and unwrap it.

    A module already imported is re-imported if its file changed since, or if another
    file of that name now comes first on the path. (Python's bytecode cache cannot see
    an edit that keeps the size and lands in the same second; such an edit is missed.)
    """
    import_triton()  # a clear error first, before the module imports triton itself
    module_name, _, attr = kernel.partition(":")
    with _path_first(search_path):
        try:
            found = _find_spec_on_path(module_name)
        except (ImportError, ValueError) as e:  # a parent package failed to import
            raise SpillError(f"cannot import kernel module {module_name!r}: "
                             f"{type(e).__name__}: {e}") from e
        if found is None or not found.origin or not os.path.isfile(found.origin):
            where = f" or in {list(search_path)}" if search_path else ""
            raise SpillError(f"cannot import kernel module {module_name!r}: not found on "
                             f"sys.path{where}")
        origin = found.origin
        sha = hashlib.sha256(Path(origin).read_bytes()).hexdigest()
        module = sys.modules.get(module_name)
        try:
            if module is None:
                module = importlib.import_module(module_name)
            elif (_IMPORTED.get(module_name, sha) != sha
                  or os.path.realpath(getattr(module, "__file__", "") or "")
                  != os.path.realpath(origin)):
                module = importlib.reload(module)
        except Exception as e:  # anything the module's own code raises while importing
            raise SpillError(f"cannot import kernel module {module_name!r}: "
                             f"{type(e).__name__}: {summarize(str(e), head=1)}") from e
        _IMPORTED[module_name] = sha
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SpillError(f"kernel {kernel!r}: module {module_name!r} has no attribute "
                             f"{attr!r}")
        obj = getattr(obj, part)
    return LoadedKernel(fn=_unwrap(obj, kernel), wrapper=obj, source_sha256=sha,
                        origin=origin)


def _find_spec_on_path(module_name: str) -> importlib.machinery.ModuleSpec | None:
    # importlib.util.find_spec answers from sys.modules for an imported module; the path
    # finder looks at the files, so a module shadowed on the search path is noticed.
    parent, _, _ = module_name.rpartition(".")
    path = importlib.import_module(parent).__path__ if parent else None
    return importlib.machinery.PathFinder.find_spec(module_name, path)


def _unwrap(obj: Any, kernel: str) -> Any:
    from triton.runtime import JITFunction, KernelInterface

    seen = 0
    while not isinstance(obj, JITFunction):
        if type(obj).__name__ == "InterpretedFunction":
            # @triton.jit returns an interpreter object when TRITON_INTERPRET=1 is set at
            # decoration time; it has no compiler front end to give PTX.
            raise SpillError(f"kernel {kernel!r} was decorated under TRITON_INTERPRET=1 "
                             "(Triton's CPU interpreter); run spill gates in a process "
                             "without TRITON_INTERPRET")
        # triton.autotune / triton.heuristics wrap the JITFunction in .fn
        if isinstance(obj, KernelInterface) and hasattr(obj, "fn") and seen < 8:
            obj, seen = obj.fn, seen + 1
            continue
        raise SpillError(f"kernel {kernel!r} is a {type(obj).__name__}, not a "
                         "@triton.jit function")
    return obj


def autotune_specs(spec: SpillSpec, search_path: Sequence[str] = ()) -> list[SpillSpec]:
    """One spec per ``triton.Config`` of the autotuned kernel ``spec.kernel`` names.

    Each config's kwargs override ``spec.constexprs``; its ``num_warps``,
    ``num_stages`` and ``maxnreg`` replace the spec's.

    Example::

        >>> autotune_specs(SpillSpec(kernel="k:softmax_tuned", ...))  # doctest: +SKIP
        [SpillSpec(... constexprs={'BLOCK': 1024}, num_warps=4 ...), ...]
    """
    wrapper = load_kernel(spec.kernel, search_path).wrapper
    configs = getattr(wrapper, "configs", None)
    if not configs:
        raise SpillError(f"kernel {spec.kernel!r} is not @triton.autotune'd; list its "
                         "constexpr configurations instead")
    out = []
    for config in configs:
        if getattr(config, "num_ctas", 1) != 1:
            raise SpillError(f"{spec.kernel}: autotune config {config} has num_ctas "
                             f"{config.num_ctas}; spill gates compile one CTA per cluster")
        out.append(replace(spec, constexprs={**spec.constexprs, **config.kwargs},
                           num_warps=config.num_warps, num_stages=config.num_stages,
                           maxnreg=getattr(config, "maxnreg", None)))
    return out


def spill_digest(spec: SpillSpec, kernel: LoadedKernel, triton_version: str,
                 ptxas: Ptxas, env: dict[str, Any]) -> str:
    """sha256 over what the measured numbers depend on.

    Covered: the spec's compile fields (not its budget: re-gating with another budget
    compiles nothing), the kernel module's source bytes, the JIT function's own
    ``cache_key`` (which hashes the ``@triton.jit`` helpers it calls, even in other
    modules), the Triton version, the full ptxas version line and Triton's
    cache-invalidating environment variables.
    """
    return sha256_hex(canonical_json({
        "schema": _CACHE_SCHEMA, "spec": spec.compile_key(),
        "module_sha256": kernel.source_sha256, "fn_cache_key": str(kernel.fn.cache_key),
        "triton": triton_version, "ptxas": ptxas.version, "env": env,
    }))


@contextlib.contextmanager
def _private_triton_cache(triton: Any) -> Iterator[None]:
    # Triton caches compiled kernels under ~/.triton/cache; a hit there would make
    # compile_seconds meaningless and write into the user's home. Point it at a
    # temporary folder for this compile (the CompiledKernel reads its files eagerly).
    with tempfile.TemporaryDirectory(prefix="cpmatrix-triton-") as tmp:
        knobs = getattr(triton, "knobs", None)
        if knobs is not None:
            with knobs.cache.scope():
                knobs.cache.dir = tmp
                yield
        else:  # Triton before knobs (< 3.4) reads the environment at each compile
            saved = os.environ.get("TRITON_CACHE_DIR")
            os.environ["TRITON_CACHE_DIR"] = tmp
            try:
                yield
            finally:
                if saved is None:
                    os.environ.pop("TRITON_CACHE_DIR", None)
                else:
                    os.environ["TRITON_CACHE_DIR"] = saved


def _fp_fusion_default(triton: Any) -> bool | None:
    """Whether the installed Triton fuses multiply-adds when a launch does not say.

    ``knobs.language.default_fp_fusion``: ``TRITON_DEFAULT_FP_FUSION`` if set, else the
    version's default (on for 3.6 to 3.9). A gate that passes it explicitly measures the
    code a default launch compiles, without the warning Triton 3.9 gives for an unset
    option (which ``filterwarnings = error`` turns into a failed compile). ``None`` where
    Triton has no such knob; the option is then left to Triton.
    """
    language = getattr(getattr(triton, "knobs", None), "language", None)
    default = getattr(language, "default_fp_fusion", None)
    return None if default is None else bool(default)


def compile_kernel(triton: Any, fn: Any, spec: SpillSpec, capability: int) -> Any:
    """``triton.compile`` for ``spec`` at ``capability``: the ``CompiledKernel``.

    Triton's stdout (it prints the whole PTX when its own ptxas fails) is kept out of the
    user's terminal; a failure becomes one :class:`SpillError` line.
    """
    from triton.backends.compiler import GPUTarget

    missing = [a for a in fn.arg_names if a not in spec.signature]
    unknown = [a for a in spec.signature if a not in fn.arg_names]
    if missing or unknown:
        raise SpillError(f"{spec.kernel}: signature does not match the kernel's parameters "
                         f"{list(fn.arg_names)}: missing {missing}, unknown {unknown}")
    signature = {a: spec.signature[a] for a in fn.arg_names}  # in parameter order
    options: dict[str, Any] = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}
    if spec.maxnreg is not None:
        options["maxnreg"] = spec.maxnreg
    fp_fusion = _fp_fusion_default(triton)
    if fp_fusion is not None:
        options["enable_fp_fusion"] = fp_fusion
    src = triton.compiler.ASTSource(fn=fn, signature=signature,
                                    constexprs=dict(spec.constexprs))
    chatter = io.StringIO()
    try:
        with _private_triton_cache(triton), contextlib.redirect_stdout(chatter):
            return triton.compile(src, target=GPUTarget("cuda", capability, 32),
                                  options=options)
    except Exception as e:  # CompilationError, PTXASError, KeyError on a bad type, ...
        raise SpillError(f"{spec.label} failed to compile: {type(e).__name__}: "
                         f"{summarize(str(e), head=2)}") from e


def compile_and_measure(spec: SpillSpec, *, cache_dir: Path | None,
                        search_path: Sequence[str] = (),
                        ptxas: str | None = None) -> SpillReport:
    """Compile ``spec`` for its arch (no GPU needed), run ``ptxas -v``, return the numbers.

    With ``cache_dir``, a result is stored as ``<digest>.json`` beside the measured
    ``<digest>.ptx`` (both written atomically) and reused while nothing it depends on
    changes (see :func:`spill_digest`); a corrupt entry is ignored and rewritten.
    ``search_path`` folders go first on ``sys.path`` to import the kernel; ``ptxas``
    overrides the ptxas binary used for the measurement (Triton's own is used for the
    compile). Raises :class:`SpillError` with a one-line message on any failure; a
    kernel that spills is a failing :meth:`SpillReport.verdict`, not an error.
    """
    triton = import_triton()
    kernel = load_kernel(spec.kernel, search_path)
    tool = resolve_ptxas(spec.arch, ptxas)
    digest = spill_digest(spec, kernel, str(triton.__version__), tool, _triton_env(triton))
    if cache_dir is not None:
        hit = _read_cache(cache_dir, digest, spec)
        if hit is not None:
            return hit
    start = time.perf_counter()
    compiled = compile_kernel(triton, kernel.fn, spec, spec.capability)
    compile_seconds = time.perf_counter() - start
    ptx = retarget_ptx(compiled.asm["ptx"], spec.arch)
    entry = str(compiled.metadata.name)
    log, ptxas_seconds = run_ptxas(tool, ptx, spec.arch, spec.label)
    stats = parse_ptxas_log(log, entry)
    report = _new_report(
        spec, stats, entry=entry, shared_bytes=int(compiled.metadata.shared),
        triton_version=str(triton.__version__), ptxas_version=tool.version,
        compile_seconds=compile_seconds, ptxas_seconds=ptxas_seconds, cached=False,
        digest=digest, ptxas_log=log)
    if cache_dir is not None:
        report = _write_cache(cache_dir, report, ptx)
    return report


def _new_report(spec: SpillSpec, stats: PtxasStats, **fields: Any) -> SpillReport:
    return SpillReport(spec=spec, registers=stats.registers,
                       stack_frame_bytes=stats.stack_frame_bytes,
                       spill_store_bytes=stats.spill_store_bytes,
                       spill_load_bytes=stats.spill_load_bytes, barriers=stats.barriers,
                       smem_bytes=stats.smem_bytes, cmem_bytes=stats.cmem_bytes, **fields)


def _triton_env(triton: Any) -> dict[str, Any]:
    # Environment variables Triton itself treats as changing compiled code, and the
    # fp-fusion default compile_kernel passes (TRITON_DEFAULT_FP_FUSION may not be one).
    getter = getattr(triton.compiler.compiler, "get_cache_invalidating_env_vars", None)
    env = dict(getter()) if getter is not None else {}
    return {**env, "cpmatrix.enable_fp_fusion": _fp_fusion_default(triton)}


def _write_cache(cache_dir: Path, report: SpillReport, ptx: str) -> SpillReport:
    ptx_path = cache_dir / f"{report.digest}.ptx"
    # PTX first: a .json on disk promises its .ptx (and the sha256 check catches a race).
    atomic_write_text(ptx_path, ptx)
    atomic_write_json(cache_dir / f"{report.digest}.json", {
        "schema": _CACHE_SCHEMA, "digest": report.digest, "entry": report.entry,
        "stats": report.stats().as_dict(), "shared_bytes": report.shared_bytes,
        "triton_version": report.triton_version, "ptxas_version": report.ptxas_version,
        "compile_seconds": report.compile_seconds, "ptxas_seconds": report.ptxas_seconds,
        "ptx_sha256": sha256_hex(ptx), "ptxas_log": report.ptxas_log,
    })
    return replace(report, ptx_path=str(ptx_path))


def _read_cache(cache_dir: Path, digest: str, spec: SpillSpec) -> SpillReport | None:
    """The cached report for ``digest``, or ``None`` if absent or not exactly valid."""
    json_path, ptx_path = cache_dir / f"{digest}.json", cache_dir / f"{digest}.ptx"
    try:
        entry = json.loads(json_path.read_text(encoding="utf-8"))
        if (entry["schema"] != _CACHE_SCHEMA or entry["digest"] != digest
                or sha256_hex(ptx_path.read_text(encoding="utf-8")) != entry["ptx_sha256"]):
            return None
        stats = PtxasStats(**entry["stats"])
        numbers = [*stats.as_dict().values(), entry["shared_bytes"]]
        texts = [entry[k] for k in ("entry", "triton_version", "ptxas_version", "ptxas_log")]
        times = [entry["compile_seconds"], entry["ptxas_seconds"]]
        if (not all(type(n) is int and n >= 0 for n in numbers)
                or not all(isinstance(t, str) for t in texts)
                or not all(isinstance(t, int | float) for t in times)):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing, unreadable, not JSON, wrong shape: recompile and rewrite
    return _new_report(spec, stats, entry=texts[0],
                       shared_bytes=entry["shared_bytes"], triton_version=texts[1],
                       ptxas_version=texts[2], compile_seconds=float(times[0]),
                       ptxas_seconds=float(times[1]), cached=True, digest=digest,
                       ptx_path=str(ptx_path), ptxas_log=texts[3])
