"""The machine a result was computed on: its part of the cache key and of provenance.

A numerics result can depend on the hardware and its software stack: torch dispatches
CPU kernels by instruction set (``torch.backends.cpu.get_cpu_capability()``: DEFAULT,
AVX2, AVX512, ...), and a GPU kernel path by compute capability, driver, CUDA, cuDNN and
NCCL. With a cache shared by unlike machines (a remote cache, a shared ``--cache-dir``),
a pass on one must not stand in for another. So the key of every cell holds:

- **cpu** cells: the CPU's ISA flags that kernels dispatch on (from ``/proc/cpuinfo``:
  ``avx*``, ``amx*``, ``fma``, ``f16c``, ``sse4*``, ``*vnni*``, ``*bf16*``, ``*fp16*``;
  on Arm ``asimd*``, ``sve*``, ``sme*``) and torch's own CPU capability, read once per
  toolchain and CPU in a subprocess of ``--python`` (remembered under ``--cache-dir``);
- **cuda** cells: all of the above (a cuda cell runs CPU code too), every visible GPU's
  name and compute capability, the driver, and the CUDA, cuDNN and NCCL versions torch
  was built with and loads (a subprocess of ``--python``, once per run).

The identity is shown in ``cpmatrix show``, on every result (``source.machine``: in
``results.json``, ``report.xml`` and ``report.html``) and in ``run.json`` (``machine``).
A :class:`MachineSource` is injectable (tests describe another machine); the default,
:class:`LocalMachine`, reads this one.

Example::

    >>> ident = MachineIdentity(cpu={"cpu_capability": "AVX2", "cpu_flags": "avx,avx2"},
    ...                         cuda={})
    >>> ident.for_device("cpu")
    {'cpu_capability': 'AVX2', 'cpu_flags': 'avx,avx2'}
    >>> ident.summary("cpu")
    'cpu AVX2 (avx,avx2)'
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from cpmatrix.fsutil import atomic_write_json

__all__ = ["LocalMachine", "MachineIdentity", "MachineSource", "cpu_flags", "machine_identity"]

#: The CPU feature flags kernels dispatch on (whole flag names matching one of these).
_RELEVANT = re.compile(r"^(avx\w*|amx\w*|fma4?|f16c|sse4_[12]|\w*vnni\w*|\w*bf16\w*|"
                       r"\w*fp16\w*|asimd\w*|sve\w*|sme(?!p$)\w*)$")

_CPU_PROBE = "import torch; print(torch.backends.cpu.get_cpu_capability())"
_CUDA_PROBE = """\
import json, torch
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
cc = [torch.cuda.get_device_capability(i) for i in range(n)]
gpus = [f"{torch.cuda.get_device_name(i)} sm_{cc[i][0]}{cc[i][1]}" for i in range(n)]
try:
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if n else ""
except Exception:
    nccl = "unknown"
print(json.dumps({"gpus": gpus, "cuda": torch.version.cuda or "",
                  "cudnn": str(torch.backends.cudnn.version() or ""), "nccl": nccl}))
"""


def cpu_flags(cpuinfo: str) -> str:
    """The relevant ISA flags of the first processor in ``/proc/cpuinfo``'s text
    (``flags`` on x86, ``Features`` on Arm), sorted, comma-separated.

    >>> cpu_flags("processor : 0\\nflags : fpu sse4_2 avx2 avx avx512f amx_tile\\n")
    'amx_tile,avx,avx2,avx512f,sse4_2'
    """
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return ",".join(sorted(f for f in value.split() if _RELEVANT.match(f)))
    return ""


@dataclass(frozen=True, slots=True)
class MachineIdentity:
    """What a result may depend on of the machine: ``cpu`` and ``cuda`` parts."""

    cpu: dict[str, str] = field(default_factory=dict)
    cuda: dict[str, str] = field(default_factory=dict)

    def for_device(self, device: str) -> dict[str, str]:
        """The key part of a cell on ``device`` ("cpu" or "cuda")."""
        return {**self.cpu, **(self.cuda if device == "cuda" else {})}

    def summary(self, device: str) -> str:
        """One line for reports (``cpu AVX2 (avx,avx2)``, ``... ; gpu ... driver ...``)."""
        line = f"cpu {self.cpu.get('cpu_capability', '?')} ({self.cpu.get('cpu_flags', '')})"
        if device == "cuda":
            c = self.cuda
            line += (f"; gpu {c.get('gpus', '?')}, driver {c.get('driver', '?')}, "
                     f"cuda {c.get('cuda', '?')}, cudnn {c.get('cudnn', '?')}, "
                     f"nccl {c.get('nccl', '?')}")
        return line


class MachineSource(Protocol):
    """Describes a machine (``LocalMachine`` this one; tests inject others)."""

    def cpu(self) -> dict[str, str]: ...

    def cuda(self) -> dict[str, str]: ...


Run = Callable[[list[str]], str]


def _run(argv: list[str]) -> str:
    """stdout of ``argv`` ("" when it cannot run or fails)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


class LocalMachine:
    """This machine, as the interpreter ``python`` (``--python``) sees it.

    ``memo``: a folder where torch's CPU capability is remembered per toolchain and CPU
    (it costs an ``import torch``); ``toolchain``: the interpreter's identity
    (:mod:`cpmatrix.cache.toolchain`), part of that memo's name.
    """

    def __init__(self, python: str, *, memo: Path | None = None,
                 toolchain: Mapping[str, str] | None = None, cpuinfo: str = "/proc/cpuinfo",
                 driver: str = "/proc/driver/nvidia/version", run: Run = _run) -> None:
        self.python, self.memo, self.toolchain = python, memo, dict(toolchain or {})
        self.cpuinfo, self.driver, self.run = cpuinfo, driver, run

    def cpu(self) -> dict[str, str]:
        try:
            text = Path(self.cpuinfo).read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        flags = cpu_flags(text)
        forced = os.environ.get("ATEN_CPU_CAPABILITY", "")
        name = hashlib.sha256(json.dumps([self.toolchain, flags, forced]).encode()).hexdigest()
        path = self.memo / f"cpu-{name}.json" if self.memo is not None else None
        try:
            capability = str(json.loads(path.read_text())["cpu_capability"]) if path else ""
        except (OSError, ValueError, KeyError, TypeError):
            capability = ""
        if not capability:
            capability = self.run([self.python, "-c", _CPU_PROBE]) or "unknown"
            if path is not None and capability != "unknown":
                try:
                    atomic_write_json(path, {"cpu_capability": capability})
                except OSError:
                    pass  # only a memo
        return {"cpu_capability": capability, "cpu_flags": flags}

    def cuda(self) -> dict[str, str]:
        try:
            first = Path(self.driver).read_text(encoding="utf-8").splitlines()[0]
            found = re.search(r"Kernel Module\s+(\S+)", first)
            driver = found.group(1) if found else first.strip()
        except (OSError, IndexError):
            lines = self.run(["nvidia-smi", "--query-gpu=driver_version",
                              "--format=csv,noheader"]).splitlines()
            driver = lines[0] if lines else "unknown"
        try:
            probe = json.loads(self.run([self.python, "-c", _CUDA_PROBE]) or "{}")
        except ValueError:
            probe = {}
        return {"gpus": "; ".join(probe.get("gpus") or []) or "none", "driver": str(driver),
                "cuda": str(probe.get("cuda", "unknown")),
                "cudnn": str(probe.get("cudnn", "unknown")),
                "nccl": str(probe.get("nccl", "unknown"))}


def machine_identity(source: MachineSource, devices: set[str]) -> MachineIdentity:
    """The identity of the machine ``source`` describes, for cells on ``devices``
    (the cuda part only when a cuda cell runs: it starts CUDA)."""
    return MachineIdentity(cpu=source.cpu(),
                           cuda=source.cuda() if "cuda" in devices else {})
