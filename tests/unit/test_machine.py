"""The machine's part of the cache key (issue 30, row 6; ``cpmatrix.cache.machine``): ISA
flags and torch's CPU capability for cpu cells, GPU, driver, CUDA, cuDNN and NCCL for
cuda cells. No GPU here: the cuda path runs on an injected device description."""

from __future__ import annotations

import doctest
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from cpmatrix.cache import machine as machine_mod
from cpmatrix.cache.key import ActionKeys, ResultCache
from cpmatrix.cache.machine import LocalMachine, MachineIdentity, cpu_flags, machine_identity
from cpmatrix.result import Result, Status

X86 = "processor\t: 0\nflags\t\t: fpu sse4_1 sse4_2 avx avx2 fma smep avx512f amx_tile\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd asimdhp sve sve2 sme crc32\n"


def test_doctests_run() -> None:
    assert doctest.testmod(machine_mod).failed == 0


def test_the_isa_flags_torch_dispatches_on_are_read() -> None:
    assert cpu_flags(X86) == "amx_tile,avx,avx2,avx512f,fma,sse4_1,sse4_2"  # not smep
    assert cpu_flags(ARM) == "asimd,asimdhp,sme,sve,sve2"
    assert cpu_flags("") == ""


class Calls:
    def __init__(self, out: dict[str, str]) -> None:
        self.out, self.argv = out, []  # type: list[list[str]]

    def __call__(self, argv: list[str]) -> str:
        self.argv.append(argv)
        return next((v for k, v in self.out.items() if k in " ".join(argv)), "")


def test_the_cpu_capability_is_probed_once_per_toolchain_and_cpu(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(X86)
    run = Calls({"get_cpu_capability": "AVX512"})
    memo = tmp_path / "memo"
    one = LocalMachine("py", memo=memo, toolchain={"t": "1"}, cpuinfo=str(info), run=run)
    assert one.cpu() == {"cpu_capability": "AVX512",
                         "cpu_flags": "amx_tile,avx,avx2,avx512f,fma,sse4_1,sse4_2"}
    assert LocalMachine("py", memo=memo, toolchain={"t": "1"}, cpuinfo=str(info),
                        run=run).cpu()["cpu_capability"] == "AVX512"
    assert len(run.argv) == 1  # remembered
    info.write_text(X86.replace(" avx512f", ""))
    run.out["get_cpu_capability"] = "AVX2"
    assert LocalMachine("py", memo=memo, toolchain={"t": "1"}, cpuinfo=str(info),
                        run=run).cpu()["cpu_capability"] == "AVX2"  # another CPU
    assert LocalMachine("py", memo=memo, toolchain={"t": "2"}, cpuinfo=str(info),
                        run=run).cpu()["cpu_capability"] == "AVX2"
    assert len(run.argv) == 3  # another toolchain probes again


def test_the_cuda_path_on_an_injected_device(tmp_path: Path) -> None:
    driver = tmp_path / "version"
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Thu\n")
    probe = json.dumps({"gpus": ["NVIDIA H100 80GB HBM3 sm_90"], "cuda": "12.8",
                        "cudnn": "90800", "nccl": "2.26.2"})
    run = Calls({"get_device_capability": probe, "get_cpu_capability": "AVX2"})
    source = LocalMachine("py", cpuinfo=str(tmp_path / "none"), driver=str(driver), run=run)
    ident = machine_identity(source, {"cpu", "cuda"})
    assert ident.cuda == {"gpus": "NVIDIA H100 80GB HBM3 sm_90", "driver": "570.86.15",
                          "cuda": "12.8", "cudnn": "90800", "nccl": "2.26.2"}
    assert ident.for_device("cuda")["gpus"] == "NVIDIA H100 80GB HBM3 sm_90"
    assert "gpus" not in ident.for_device("cpu")
    assert "driver 570.86.15" in ident.summary("cuda")
    assert machine_identity(source, {"cpu"}).cuda == {}  # no CUDA started for cpu cells


def _key(keys: ActionKeys, cell: Any, ident: MachineIdentity, device: str) -> str:
    return keys.digest(cell, runner_identity={}, env={}, toolchain={},
                       machine=ident.for_device(device))


def test_unlike_machines_never_share_a_pass(tmp_path: Path) -> None:
    """Two caches (or one shared) keyed with different identities: a pass stored on
    one machine is a miss on the other, a hit on the same."""
    cell: Any = SimpleNamespace(id="t[unit]@cpu", digest="d" * 64, case="cpmatrix.fsutil:x")
    keys = ActionKeys(search_path=())
    avx512 = MachineIdentity(cpu={"cpu_capability": "AVX512", "cpu_flags": "avx2,avx512f"})
    avx2 = MachineIdentity(cpu={"cpu_capability": "AVX2", "cpu_flags": "avx2"})
    sm80 = MachineIdentity(cpu=avx2.cpu, cuda={"gpus": "A100 sm_80", "driver": "1"})
    sm90 = MachineIdentity(cpu=avx2.cpu, cuda={"gpus": "H100 sm_90", "driver": "1"})
    assert len({_key(keys, cell, i, "cpu") for i in (avx512, avx2)}) == 2
    assert len({_key(keys, cell, i, "cuda") for i in (sm80, sm90)}) == 2
    assert _key(keys, cell, sm80, "cpu") == _key(keys, cell, sm90, "cpu")  # cpu cells
    shared = ResultCache(tmp_path / "cache")
    passed = Result(cell_id=cell.id, status=Status.PASSED)
    assert shared.put(_key(keys, cell, avx512, "cpu"), passed, {})
    assert shared.get(_key(keys, cell, avx2, "cpu"), cell.id) is None
    hit = ResultCache(tmp_path / "cache").get(_key(keys, cell, avx512, "cpu"), cell.id)
    assert hit is not None and hit.status is Status.CACHED
