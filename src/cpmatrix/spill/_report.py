"""What a spill gate measured, and whether it passes: :class:`SpillReport`, :class:`SpillVerdict`.

Pure: a report is plain data (it serializes to the JSON the cache stores) and its
verdict is a function of the numbers, the budget and whether the spec is a declared
negative control.

Example::

    >>> from cpmatrix.spill._spec import SpillSpec
    >>> spec = SpillSpec(kernel="m:k", signature={"n": "i32"}, constexprs={}, arch="sm_80")
    >>> r = SpillReport(spec=spec, entry="k", registers=255, stack_frame_bytes=144,
    ...                 spill_store_bytes=144, spill_load_bytes=188, shared_bytes=0,
    ...                 triton_version="3.6.0", ptxas_version="V12.8.93",
    ...                 compile_seconds=1.9, ptxas_seconds=1.4, cached=False, digest="d")
    >>> r.verdict()
    SpillVerdict(passed=False, message='spilled 144 bytes stores + 188 bytes loads > budget 0 \
(registers 255, stack 144)')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cpmatrix.spill._ptxas import PtxasStats
from cpmatrix.spill._spec import SpillSpec

__all__ = ["SpillReport", "SpillVerdict"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SpillVerdict:
    """Pass or fail, with a one-line message that carries the numbers."""

    passed: bool
    message: str


@dataclass(frozen=True, kw_only=True, slots=True)
class SpillReport:
    """One compile of one :class:`SpillSpec`, measured by ``ptxas -v``.

    Fields beyond the spec:
        entry: the PTX entry function ptxas reported on (Triton's kernel name).
        registers, stack_frame_bytes, spill_store_bytes, spill_load_bytes, barriers,
            smem_bytes, cmem_bytes: as ptxas printed them for ``entry`` (per thread for
            registers and local memory).
        shared_bytes: the dynamic shared memory Triton allocates for the kernel.
        triton_version, ptxas_version: the tools that produced the numbers.
        compile_seconds: Triton's compile to PTX and cubin (it runs ptxas itself too);
            ptxas_seconds: this gate's own ``ptxas -v`` run. For a cached report, the
            times of the compile that made the entry.
        cached: the numbers came from the cache; nothing was compiled this time.
        digest: the cache key (see :func:`cpmatrix.spill.spill_digest`).
        ptx_path: the PTX ptxas measured, if it is kept in a cache folder.
        ptxas_log: ptxas's full ``-v`` output, for evidence.
    """

    spec: SpillSpec
    entry: str
    registers: int
    stack_frame_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    barriers: int = 0
    smem_bytes: int = 0
    cmem_bytes: int = 0
    shared_bytes: int
    triton_version: str
    ptxas_version: str
    compile_seconds: float
    ptxas_seconds: float
    cached: bool
    digest: str
    ptx_path: str | None = None
    ptxas_log: str = field(default="", repr=False)

    @property
    def spilled_bytes(self) -> int:
        """Spill stores plus spill loads: what the budget is compared with."""
        return self.spill_store_bytes + self.spill_load_bytes

    @property
    def over_budget(self) -> bool:
        return self.spilled_bytes > self.spec.budget_bytes

    def stats(self) -> PtxasStats:
        return PtxasStats(registers=self.registers, stack_frame_bytes=self.stack_frame_bytes,
                          spill_store_bytes=self.spill_store_bytes,
                          spill_load_bytes=self.spill_load_bytes, barriers=self.barriers,
                          smem_bytes=self.smem_bytes, cmem_bytes=self.cmem_bytes)

    def verdict(self) -> SpillVerdict:
        """Pass/fail with the numbers; a negative control passes only if it spills.

        Stack frame bytes are reported but not gated: a stack frame without spills is
        local memory the kernel asked for (e.g. an indexed array), not a spill.
        """
        cmp = ">" if self.over_budget else "<="
        numbers = (f"spilled {self.spill_store_bytes} bytes stores + {self.spill_load_bytes} "
                   f"bytes loads {cmp} budget {self.spec.budget_bytes} (registers "
                   f"{self.registers}, stack {self.stack_frame_bytes})")
        if not self.spec.expect_spill:
            return SpillVerdict(passed=not self.over_budget, message=numbers)
        if self.over_budget:
            return SpillVerdict(passed=True, message=f"negative control {numbers}, as declared")
        return SpillVerdict(passed=False,
                            message=f"negative control did not spill: {numbers}; a gate "
                                    "that cannot fail this configuration proves nothing")

    def evidence(self) -> dict[str, Any]:
        """A flat, JSON-ready dict of everything measured, for result records."""
        verdict = self.verdict()
        return {
            "kernel": self.spec.kernel, "arch": self.spec.arch,
            "constexprs": dict(self.spec.constexprs), "num_warps": self.spec.num_warps,
            "num_stages": self.spec.num_stages, "maxnreg": self.spec.maxnreg,
            "budget_bytes": self.spec.budget_bytes, "expect_spill": self.spec.expect_spill,
            "entry": self.entry, **self.stats().as_dict(), "shared_bytes": self.shared_bytes,
            "spilled_bytes": self.spilled_bytes, "passed": verdict.passed,
            "message": verdict.message, "triton_version": self.triton_version,
            "ptxas_version": self.ptxas_version,
            "compile_seconds": round(self.compile_seconds, 3),
            "ptxas_seconds": round(self.ptxas_seconds, 3), "cached": self.cached,
            "digest": self.digest,
        }
