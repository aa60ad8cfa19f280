"""ptxas: find it, run ``ptxas -v`` on PTX, and parse what it reports about a kernel.

:func:`parse_ptxas_log` is pure. ``ptxas -v`` prints, per entry function (the
``ptxas-blackwell`` of sm_100+ prefixes its lines with its own name)::

    ptxas info    : Compiling entry function 'row_softmax' for 'sm_80'
    ptxas info    : Function properties for row_softmax
        144 bytes stack frame, 144 bytes spill stores, 188 bytes spill loads
    ptxas info    : Used 255 registers, used 0 barriers, 144 bytes cumulative stack size,
                    392 bytes cmem[0]                       (one line, wrapped here)

and a ``Function properties`` block for every ``noinline`` device function too (after
its entry's ``Used`` line), so the parser keys every number by the function it is
printed under and reports the entry's own.

Example::

    >>> log = '''ptxas info    : Compiling entry function 'k' for 'sm_80'
    ... ptxas info    : Function properties for k
    ...     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
    ... ptxas info    : Used 40 registers, 16 bytes smem, 392 bytes cmem[0]'''
    >>> parse_ptxas_log(log, "k")
    PtxasStats(registers=40, stack_frame_bytes=8, spill_store_bytes=4, spill_load_bytes=12, \
barriers=0, smem_bytes=16, cmem_bytes=392)
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from cpmatrix.spill._spec import ARCHS, SpillError

__all__ = ["PTXAS_TIMEOUT_S", "Ptxas", "PtxasStats", "parse_ptxas_log", "resolve_ptxas",
           "retarget_ptx", "run_ptxas", "summarize"]

#: A pathological configuration can keep ptxas busy for minutes; past this it is a failure.
PTXAS_TIMEOUT_S = 600.0

_COMPILING = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[\d+\]")


@dataclass(frozen=True, kw_only=True, slots=True)
class PtxasStats:
    """What ``ptxas -v`` reports for one entry function.

    ``smem_bytes`` is *static* shared memory only; Triton allocates its shared memory
    dynamically (see ``SpillReport.shared_bytes``). ``cmem_bytes`` sums the constant
    banks (bank 0 holds the kernel parameters).
    """

    registers: int
    stack_frame_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    barriers: int = 0
    smem_bytes: int = 0
    cmem_bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def parse_ptxas_log(log: str, entry: str) -> PtxasStats:
    """The numbers ``ptxas -v`` printed for entry function ``entry``.

    Raises :class:`SpillError` (naming the entries it did find) if the log has no
    register line or no stack/spill line for ``entry``.
    """
    frames: dict[str, tuple[int, int, int]] = {}
    used: dict[str, PtxasStats] = {}
    current_entry: str | None = None
    properties_of: str | None = None
    for line in log.splitlines():
        if m := _COMPILING.search(line):
            current_entry = m.group(1)
        elif m := _PROPERTIES.search(line):
            properties_of = m.group(1)
        elif (m := _FRAME.search(line)) and properties_of is not None:
            frames[properties_of] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _USED.search(line)) and current_entry is not None:
            used[current_entry] = PtxasStats(
                registers=int(m.group(1)), stack_frame_bytes=0, spill_store_bytes=0,
                spill_load_bytes=0, barriers=_first_int(_BARRIERS, line),
                smem_bytes=_first_int(_SMEM, line),
                cmem_bytes=sum(int(c) for c in _CMEM.findall(line)))
    if entry not in used or entry not in frames:
        found = sorted(set(used) | set(frames))
        raise SpillError(f"ptxas -v printed no register and spill report for entry "
                         f"{entry!r} (found: {found or 'nothing'}): {summarize(log)}")
    stack, stores, loads = frames[entry]
    regs = used[entry]
    return PtxasStats(registers=regs.registers, stack_frame_bytes=stack,
                      spill_store_bytes=stores, spill_load_bytes=loads,
                      barriers=regs.barriers, smem_bytes=regs.smem_bytes,
                      cmem_bytes=regs.cmem_bytes)


def _first_int(pattern: re.Pattern[str], line: str) -> int:
    m = pattern.search(line)
    return int(m.group(1)) if m else 0


def summarize(message: str, head: int = 3, width: int = 400) -> str:
    """One line from a compiler message: its first ``head`` lines and its last line.

    Triton's compile errors put the location first and the cause last, with source
    lines between; ptxas puts the cause first.

    >>> summarize("at 3:11:\\ndef k():\\n  x\\n  ^\\narange's range must be a power of 2", head=1)
    "at 3:11: | … | arange's range must be a power of 2"
    """
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    if not lines:
        return "(no message)"
    kept = lines if len(lines) <= head + 1 else [*lines[:head], "…", lines[-1]]
    text = " | ".join(kept)
    return text if len(text) <= width else text[: width - 1] + "…"


@dataclass(frozen=True, slots=True)
class Ptxas:
    """A ptxas binary and its full version line (part of every cache digest)."""

    path: str
    version: str


def resolve_ptxas(arch: str, override: str | None = None) -> Ptxas:
    """The ptxas Triton uses for ``arch`` (or ``override``), with its version.

    Triton picks it with ``triton.backends.nvidia.compiler.get_ptxas(capability)``:
    its wheel's ``ptxas`` below sm_100 and ``ptxas-blackwell`` from sm_100 on (both
    honour ``TRITON_PTXAS_PATH`` / ``TRITON_PTXAS_BLACKWELL_PATH``).
    """
    if override is not None:
        return Ptxas(override, _version(override))
    try:
        from triton.backends.nvidia.compiler import get_ptxas
    except ImportError as e:
        raise SpillError(f"ptxas missing: this Triton has no NVIDIA backend with get_ptxas "
                         f"({e}); pass a ptxas path explicitly") from e
    try:
        path = str(get_ptxas(ARCHS[arch]).path)
    except RuntimeError as e:  # knobs.env_nvidia_tool: "Cannot find ptxas"
        raise SpillError(f"ptxas missing for {arch}: {e} (Triton's wheel ships it under "
                         "triton/backends/nvidia/bin/; reinstall triton or set "
                         "TRITON_PTXAS_PATH)") from e
    return Ptxas(path, _version(path))


@functools.lru_cache(maxsize=16)
def _version(path: str) -> str:
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        raise SpillError(f"ptxas missing: cannot run {path!r} ({e})") from e
    if proc.returncode != 0:
        raise SpillError(f"ptxas at {path!r} failed to report its version (exit "
                         f"{proc.returncode}): {summarize(proc.stderr + proc.stdout)}")
    # "Cuda compilation tools, release 12.8, V12.8.93": the build, not just "12.8".
    m = re.search(r"^.*release \S+, V\S+.*$", proc.stdout, flags=re.MULTILINE)
    return m.group(0).strip() if m else summarize(proc.stdout)


def retarget_ptx(ptx: str, arch: str) -> str:
    """PTX for ``arch``: Triton writes ``.target sm_90a`` for every capability-90 build.

    ptxas refuses sm_90a PTX for ``--gpu-name=sm_90``, so a plain-arch gate rewrites the
    target line (and PTX that needs the ``a`` features then fails in ptxas, as it should).
    """
    if arch.endswith("a"):
        return ptx
    return re.sub(r"^(\s*\.target\s+)sm_\d+a\b", rf"\g<1>{arch}", ptx, count=1,
                  flags=re.MULTILINE)


def run_ptxas(tool: Ptxas, ptx: str, arch: str, what: str) -> tuple[str, float]:
    """Run ``ptxas -v --gpu-name=ARCH file.ptx -o /dev/null``; return its log and seconds.

    ``what`` names the kernel in error messages.
    """
    with tempfile.TemporaryDirectory(prefix="cpmatrix-ptxas-") as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx, encoding="utf-8")
        cmd = [tool.path, "-v", f"--gpu-name={arch}", str(src), "-o", os.devnull]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True,
                                  timeout=PTXAS_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as e:
            raise SpillError(f"{what}: ptxas ran past {PTXAS_TIMEOUT_S:.0f} s") from e
        except OSError as e:
            raise SpillError(f"ptxas missing: cannot run {tool.path!r} ({e})") from e
        seconds = time.perf_counter() - start
    log = proc.stderr + proc.stdout
    if proc.returncode != 0:
        hint = ""
        if not arch.endswith("a") and ARCHS[arch] >= 90:
            hint = f" (Triton assembles {arch}a on these GPUs; try arch {arch}a)"
        raise SpillError(f"{what}: ptxas failed (exit {proc.returncode}): "
                         f"{summarize(log)}{hint}")
    return log, seconds
