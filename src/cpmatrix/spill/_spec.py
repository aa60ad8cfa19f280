"""What a spill gate compiles: :class:`SpillSpec`, the archs it knows, :class:`SpillError`.

Pure: nothing here imports triton, so a matrix can be loaded and listed without it.

Example::

    >>> spec = SpillSpec(kernel="pkg.kernels:row_softmax",
    ...                  signature={"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
    ...                  constexprs={"BLOCK": 1024}, arch="sm_90a")
    >>> spec.label
    'pkg.kernels:row_softmax[BLOCK=1024]@sm_90a/w4s3'
    >>> try:
    ...     SpillSpec(kernel="m:k", signature={"n": "i32"}, constexprs={}, arch="sm_91")
    ... except SpillError as e:
    ...     print(e)  # doctest: +ELLIPSIS
    unknown arch 'sm_91' (allowed: sm_75, sm_80, ..., sm_120a)
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cpmatrix.matrix.schema import ARCHS

__all__ = ["ARCHS", "ConstexprValue", "SpillError", "SpillSpec", "spec_for_cell",
           "specs_from_table"]

#: A value a ``tl.constexpr`` parameter may take in a spec (JSON-serializable, so it can
#: go into a digest and a report).
ConstexprValue = int | bool | float | str


_KERNEL = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


class SpillError(Exception):
    """A spill gate could not measure a kernel; ``str()`` is one line, fit for users.

    Raised for a bad spec (unknown arch, signature mismatch), a missing Triton or ptxas,
    a kernel that cannot be imported or is not ``@triton.jit``, and a compile failure.
    A kernel that compiles and spills is *not* an error: it is a failing
    :meth:`SpillReport.verdict <cpmatrix.spill.SpillReport.verdict>`.
    """


@dataclass(frozen=True, kw_only=True, slots=True)
class SpillSpec:
    """One (kernel, constexpr configuration, arch) to compile and gate.

    Fields:
        kernel: ``"module:attr"`` of a ``@triton.jit`` function (or of an autotuned /
            heuristics wrapper around one); ``attr`` may be dotted.
        signature: Triton signature types by parameter name, every parameter of the
            kernel, e.g. ``{"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}``.
        constexprs: a value for every ``"constexpr"`` parameter.
        arch: one of :data:`ARCHS`, e.g. ``"sm_80"``, ``"sm_90a"``.
        num_warps: power of two, 1..32 (Triton's option of that name).
        num_stages: software-pipelining depth (Triton's option of that name).
        maxnreg: Triton's ``maxnreg`` option (a per-thread register cap), or ``None``.
        budget_bytes: spill bytes (stores + loads) allowed before the gate fails; 0 means
            any spill fails.
        expect_spill: a declared negative control: the gate passes only if this
            configuration *does* spill over the budget, which shows the gate can fail.

    The dict fields are copied on construction, so the caller's dicts may change later
    without changing the spec. Construction validates everything checkable without
    Triton and raises :class:`SpillError` with the bad value and what is allowed.
    """

    kernel: str
    signature: Mapping[str, str]
    constexprs: Mapping[str, ConstexprValue]
    arch: str
    num_warps: int = 4
    num_stages: int = 3
    maxnreg: int | None = None
    budget_bytes: int = 0
    expect_spill: bool = False

    def __post_init__(self) -> None:
        # Copies, so a spec stays what it was when made (frozen is shallow).
        object.__setattr__(self, "signature", dict(self.signature))
        object.__setattr__(self, "constexprs", dict(self.constexprs))
        if not _KERNEL.fullmatch(self.kernel):
            raise SpillError(f"kernel {self.kernel!r} must be 'module:attr' "
                             "(e.g. 'pkg.kernels:softmax_fwd_kernel')")
        if self.arch not in ARCHS:
            hint = (f"; Triton assembles {self.arch}a for that GPU"
                    if f"{self.arch}a" in ARCHS else "")
            raise SpillError(f"unknown arch {self.arch!r} (allowed: {', '.join(ARCHS)}){hint}")
        if self.num_warps not in (1, 2, 4, 8, 16, 32):
            raise SpillError(f"{self.kernel}: num_warps {self.num_warps} must be a power "
                             "of two from 1 to 32")
        if self.num_stages < 1:
            raise SpillError(f"{self.kernel}: num_stages {self.num_stages} must be >= 1")
        if self.maxnreg is not None and not 16 <= self.maxnreg <= 255:
            raise SpillError(f"{self.kernel}: maxnreg {self.maxnreg} must be 16..255 or None")
        if self.budget_bytes < 0:
            raise SpillError(f"{self.kernel}: budget_bytes {self.budget_bytes} must be >= 0")
        if not self.signature:
            raise SpillError(f"{self.kernel}: empty signature (give every parameter's "
                             "Triton type, e.g. {'x_ptr': '*fp32', 'BLOCK': 'constexpr'})")
        for name, ty in self.signature.items():
            if not isinstance(name, str) or not isinstance(ty, str):
                raise SpillError(f"{self.kernel}: signature entry {name!r}: {ty!r} must map "
                                 "a parameter name to a Triton type string")
        declared = [n for n, t in self.signature.items() if t == "constexpr"]
        missing = [n for n in declared if n not in self.constexprs]
        stray = [n for n in self.constexprs if n not in declared]
        if missing or stray:
            raise SpillError(f"{self.kernel}: constexprs must give exactly the 'constexpr' "
                             f"parameters {declared}; missing {missing}, not constexpr {stray}")
        for name, value in self.constexprs.items():
            if not isinstance(value, int | float | str):
                raise SpillError(f"{self.kernel}: constexpr {name}={value!r} must be an int, "
                                 "bool, float or str")

    def __hash__(self) -> int:
        # The generated hash would hash the dicts and fail; hash what equality compares.
        return hash((self.kernel, tuple(sorted(self.signature.items())),
                     tuple(sorted(self.constexprs.items())), self.arch, self.num_warps,
                     self.num_stages, self.maxnreg, self.budget_bytes, self.expect_spill))

    @property
    def capability(self) -> int:
        """The compute capability Triton compiles for (``GPUTarget``'s ``arch``)."""
        return ARCHS[self.arch]

    @property
    def label(self) -> str:
        """A short, stable, human-readable name: kernel, constexprs, arch, warps, stages."""
        ce = ",".join(f"{k}={v}" for k, v in sorted(self.constexprs.items()))
        reg = f"r{self.maxnreg}" if self.maxnreg is not None else ""
        return f"{self.kernel}[{ce}]@{self.arch}/w{self.num_warps}s{self.num_stages}{reg}"

    def compile_key(self) -> dict[str, Any]:
        """The fields that change the compiled code (budget and expect_spill do not).

        The cache is keyed on these, so re-gating with another budget compiles nothing.
        """
        return {"kernel": self.kernel, "signature": dict(self.signature),
                "constexprs": dict(self.constexprs), "arch": self.arch,
                "num_warps": self.num_warps, "num_stages": self.num_stages,
                "maxnreg": self.maxnreg}


_TABLE_KEYS = {"signature", "constexprs", "options", "budget_bytes", "expect_spill"}
_OPTION_KEYS = {"num_warps", "num_stages", "maxnreg"}


def specs_from_table(module: str, table: Mapping[str, Mapping[str, Any]],
                     archs: Sequence[str]) -> list[SpillSpec]:
    """Specs from a kernel module's ``SPILL_SPECS`` table, one per (entry, arch).

    A table maps a ``@triton.jit`` attribute name to ``{"signature": ..., "constexprs":
    ..., "options": {"num_warps": 4, "num_stages": 3, "maxnreg": None}}`` and optionally
    ``"budget_bytes"`` and ``"expect_spill"``.

    Example::

        >>> from cpmatrix.suite.kernels import softmax  # doctest: +SKIP
        >>> specs = specs_from_table(softmax.__name__, softmax.SPILL_SPECS,
        ...                          ["sm_80", "sm_90a"])  # doctest: +SKIP
    """
    specs = []
    for attr, entry in table.items():
        unknown = set(entry) - _TABLE_KEYS
        options = dict(entry.get("options", {}))
        unknown_opts = set(options) - _OPTION_KEYS
        if unknown or unknown_opts:
            raise SpillError(f"{module}:{attr}: unknown keys {sorted(unknown | unknown_opts)} "
                             f"(allowed: {sorted(_TABLE_KEYS)}; options: "
                             f"{sorted(_OPTION_KEYS)})")
        for arch in archs:
            specs.append(SpillSpec(
                kernel=f"{module}:{attr}", signature=entry.get("signature", {}),
                constexprs=entry.get("constexprs", {}), arch=arch,
                budget_bytes=entry.get("budget_bytes", 0),
                expect_spill=entry.get("expect_spill", False), **options))
    return specs


def spec_for_cell(spill: Mapping[str, Any], search_path: Sequence[str]) -> SpillSpec:
    """A SpillSpec from a cell's spill JSON (``table`` mode reads the module's table)."""
    kernel = spill["kernel"]
    signature = dict(spill["signature"])
    constexprs = dict(spill["constexprs"])
    num_warps, num_stages = spill["num_warps"], spill["num_stages"]
    if spill.get("table"):
        module, _, attr = kernel.partition(":")
        for p in reversed(search_path):
            if p not in sys.path:
                sys.path.insert(0, p)
        try:
            table = getattr(importlib.import_module(module), spill["table"])
            entry = table[attr]
        except (ImportError, AttributeError, KeyError) as exc:
            raise SpillError(f"{kernel}: no entry {attr!r} in {module}.{spill['table']} "
                             f"({type(exc).__name__}: {exc})") from None
        signature = dict(entry.get("signature", {}))
        constexprs = {**dict(entry.get("constexprs", {})), **constexprs}
        options = dict(entry.get("options", {}))
        num_warps = options.get("num_warps", num_warps)
        num_stages = options.get("num_stages", num_stages)
    return SpillSpec(kernel=kernel, signature=signature, constexprs=constexprs,
                     arch=spill["arch"], num_warps=num_warps, num_stages=num_stages,
                     budget_bytes=spill["budget_bytes"], expect_spill=spill["expect_spill"])
