"""Spill gates: the real Triton compiler and the real ptxas from Triton's wheel, no GPU.

Pure parts (parser, verdicts, spec validation) are table-driven; the rest compiles
small kernels from tests/resources/spill_kernels.py. The spilling case is
row_softmax at BLOCK=8192 with one warp (~3 s); everything else compiles in well under
a second. Compile times are recorded as test properties (``--junitxml`` shows them).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cpmatrix.spill import (
    ARCHS,
    PtxasStats,
    SpillError,
    SpillReport,
    SpillSpec,
    autotune_specs,
    compile_and_measure,
    crosscheck_loaded,
    parse_ptxas_log,
    specs_from_table,
)
from cpmatrix.spill._ptxas import retarget_ptx, summarize

RESOURCES = Path(__file__).parents[1] / "resources"
SEARCH = (str(RESOURCES),)
SUITE_KERNELS = Path(__file__).parents[2] / "src" / "cpmatrix" / "suite" / "kernels"
SIG = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n_cols": "i32", "stride": "i32",
       "BLOCK": "constexpr"}
#: The cheapest configuration found that spills on every arch (see spill_kernels.py).
SPILLING = {"BLOCK": 8192}

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None
    or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
    reason="needs triton (pip install cpmatrix[kernels]) and TRITON_INTERPRET unset")


def softmax_spec(block: int = 1024, arch: str = "sm_80", kernel: str = "row_softmax",
                 **kw: Any) -> SpillSpec:
    return SpillSpec(kernel=f"spill_kernels:{kernel}", signature=SIG,
                     constexprs={"BLOCK": block}, arch=arch, **kw)


def spilling_spec(arch: str = "sm_80", **kw: Any) -> SpillSpec:
    return softmax_spec(SPILLING["BLOCK"], arch, num_warps=1, **kw)


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the module: a spilling config compiles once for all its tests."""
    return tmp_path_factory.mktemp("spill-cache")


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts real ``triton.compile`` calls (a spy: every call still compiles)."""
    import triton

    calls: list[str] = []
    real = triton.compile

    def spy(src: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(src.name)
        return real(src, *args, **kwargs)

    monkeypatch.setattr(triton, "compile", spy)
    return calls


def record(request: pytest.FixtureRequest, report: SpillReport) -> None:
    """Keep the numbers and compile time on the test's report (``-rP`` prints them).

    ``record_property`` would warn under the default junit family (xunit2), and
    warnings are errors here; ``user_properties`` is what it appends to.
    """
    line = (f"{report.spec.label}: registers {report.registers}, stack "
            f"{report.stack_frame_bytes}, stores {report.spill_store_bytes}, loads "
            f"{report.spill_load_bytes}, compile {report.compile_seconds:.2f}s, ptxas "
            f"{report.ptxas_seconds:.2f}s, cached {report.cached}")
    request.node.user_properties.append(("spill", line))
    print(line)


# --- ptxas -v parsing (pure) -------------------------------------------------------------

LOG_SM80 = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'row_softmax' for 'sm_80'
ptxas info    : Function properties for row_softmax
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 26 registers, used 1 barriers, 392 bytes cmem[0]
ptxas info    : Compile time = 13.085 ms
"""
LOG_SPILL = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'row_softmax' for 'sm_90a'
ptxas info    : Function properties for row_softmax
    3888 bytes stack frame, 7516 bytes spill stores, 9692 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 3888 bytes cumulative stack size
ptxas info    : Compile time = 3667.046 ms
"""
LOG_BLACKWELL = """\
ptxas-blackwell info    : Compiling entry function 'k' for 'sm_100a'
ptxas-blackwell info    : Function properties for k
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas-blackwell info    : Used 27 registers, used 1 barriers, 1024 bytes smem
"""
# Two entries, and a noinline device function whose properties ptxas prints after its
# entry's "Used" line (the order seen with triton 3.6 and ptxas 12.8). Each number
# belongs to the function it is printed under.
LOG_TWO_ENTRIES = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'first' for 'sm_80'
ptxas info    : Function properties for first
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, 360 bytes cmem[0], 8 bytes cmem[2]
ptxas info    : Compile time = 4.126 ms
ptxas info    : Function properties for k2_$_helper__Pfp32_i32__
    48 bytes stack frame, 40 bytes spill stores, 40 bytes spill loads
ptxas info    : Compiling entry function 'second' for 'sm_80'
ptxas info    : Function properties for second
    96 bytes stack frame, 100 bytes spill stores, 120 bytes spill loads
ptxas info    : Used 255 registers, 2048 bytes smem, 360 bytes cmem[0]
"""


@pytest.mark.parametrize(("log", "entry", "expected"), [
    pytest.param(LOG_SM80, "row_softmax", PtxasStats(
        registers=26, stack_frame_bytes=0, spill_store_bytes=0, spill_load_bytes=0,
        barriers=1, cmem_bytes=392), id="sm80-clean"),
    pytest.param(LOG_SPILL, "row_softmax", PtxasStats(
        registers=32, stack_frame_bytes=3888, spill_store_bytes=7516, spill_load_bytes=9692,
        barriers=1), id="sm90a-spill"),
    pytest.param(LOG_BLACKWELL, "k", PtxasStats(
        registers=27, stack_frame_bytes=16, spill_store_bytes=8, spill_load_bytes=4,
        barriers=1, smem_bytes=1024), id="blackwell-prefix"),
    pytest.param(LOG_TWO_ENTRIES, "first", PtxasStats(
        registers=12, stack_frame_bytes=0, spill_store_bytes=0, spill_load_bytes=0,
        cmem_bytes=368), id="first-of-two"),
    pytest.param(LOG_TWO_ENTRIES, "second", PtxasStats(
        registers=255, stack_frame_bytes=96, spill_store_bytes=100, spill_load_bytes=120,
        smem_bytes=2048, cmem_bytes=360), id="second-of-two"),
])
def test_parse_ptxas_log(log: str, entry: str, expected: PtxasStats) -> None:
    assert parse_ptxas_log(log, entry) == expected


@pytest.mark.parametrize(("log", "entry", "needle"), [
    (LOG_SM80, "other", "found: ['row_softmax']"),
    (LOG_TWO_ENTRIES, "k2_$_helper__Pfp32_i32__", "found: ['first', 'k2_$_helper"),
    ("ptxas fatal   : Unresolved extern function 'x'", "k", "found: nothing"),
])
def test_parse_ptxas_log_without_the_entry(log: str, entry: str, needle: str) -> None:
    with pytest.raises(SpillError, match=re.escape(needle)):
        parse_ptxas_log(log, entry)


# --- verdicts (pure) ---------------------------------------------------------------------

def fake_report(stores: int, loads: int, *, budget: int = 0, expect_spill: bool = False,
                registers: int = 255, stack: int = 144) -> SpillReport:
    spec = softmax_spec(budget_bytes=budget, expect_spill=expect_spill)
    return SpillReport(spec=spec, entry="row_softmax", registers=registers,
                       stack_frame_bytes=stack, spill_store_bytes=stores,
                       spill_load_bytes=loads, shared_bytes=0, triton_version="t",
                       ptxas_version="p", compile_seconds=1.0, ptxas_seconds=1.0,
                       cached=False, digest="d")


@pytest.mark.parametrize(("report", "passed", "message"), [
    (fake_report(0, 0, registers=26, stack=0), True,
     "spilled 0 bytes stores + 0 bytes loads <= budget 0 (registers 26, stack 0)"),
    (fake_report(7420, 9508, registers=255, stack=3816), False,
     "spilled 7420 bytes stores + 9508 bytes loads > budget 0 (registers 255, stack 3816)"),
    (fake_report(144, 188, budget=332), True,
     "spilled 144 bytes stores + 188 bytes loads <= budget 332 (registers 255, stack 144)"),
    (fake_report(144, 188, budget=331), False,
     "spilled 144 bytes stores + 188 bytes loads > budget 331 (registers 255, stack 144)"),
    (fake_report(0, 0, stack=64), True,  # local memory without spills is not gated
     "spilled 0 bytes stores + 0 bytes loads <= budget 0 (registers 255, stack 64)"),
    (fake_report(144, 188, expect_spill=True), True,
     "negative control spilled 144 bytes stores + 188 bytes loads > budget 0 (registers 255,"
     " stack 144), as declared"),
    (fake_report(0, 0, expect_spill=True, registers=26, stack=0), False,
     "negative control did not spill: spilled 0 bytes stores + 0 bytes loads <= budget 0 "
     "(registers 26, stack 0); a gate that cannot fail this configuration proves nothing"),
])
def test_verdict(report: SpillReport, passed: bool, message: str) -> None:
    verdict = report.verdict()
    assert (verdict.passed, verdict.message) == (passed, message)
    assert report.over_budget == (report.spilled_bytes > report.spec.budget_bytes)
    evidence = report.evidence()
    assert evidence["passed"] is passed and evidence["message"] == message
    json.dumps(evidence)  # JSON-ready


# --- specs (pure) ------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"arch": "sm_91"}, "unknown arch 'sm_91' (allowed: sm_75, sm_80, sm_86"),
    ({"arch": "sm90"}, "unknown arch 'sm90'"),
    ({"arch": "sm_100"}, "sm_120a); Triton assembles sm_100a for that GPU"),
    ({"kernel": "spill_kernels.row_softmax"}, "must be 'module:attr'"),
    ({"num_warps": 3}, "num_warps 3 must be a power of two"),
    ({"num_stages": 0}, "num_stages 0 must be >= 1"),
    ({"maxnreg": 8}, "maxnreg 8 must be 16..255"),
    ({"budget_bytes": -1}, "budget_bytes -1 must be >= 0"),
    ({"constexprs": {}}, "missing ['BLOCK']"),
    ({"constexprs": {"BLOCK": 1024, "n_cols": 3}}, "not constexpr ['n_cols']"),
    ({"constexprs": {"BLOCK": [1024]}}, "constexpr BLOCK=[1024] must be an int"),
    ({"signature": {}}, "empty signature"),
])
def test_spec_validation(kwargs: dict[str, Any], needle: str) -> None:
    args: dict[str, Any] = {"kernel": "spill_kernels:row_softmax", "signature": SIG,
                            "constexprs": {"BLOCK": 1024}, "arch": "sm_80", **kwargs}
    with pytest.raises(SpillError, match=re.escape(needle)):
        SpillSpec(**args)


def test_spec_copies_its_dicts_and_budget_is_not_a_compile_key() -> None:
    constexprs = {"BLOCK": 1024}
    spec = SpillSpec(kernel="m:k", signature=SIG, constexprs=constexprs, arch="sm_90a")
    constexprs["BLOCK"] = 2048
    assert spec.constexprs == {"BLOCK": 1024}
    assert spec.label == "m:k[BLOCK=1024]@sm_90a/w4s3"
    other = SpillSpec(kernel="m:k", signature=SIG, constexprs={"BLOCK": 1024},
                      arch="sm_90a", budget_bytes=100, expect_spill=True)
    assert spec.compile_key() == other.compile_key()
    assert len({spec, other, SpillSpec(kernel="m:k", signature=dict(reversed(SIG.items())),
                                        constexprs={"BLOCK": 1024}, arch="sm_90a")}) == 2


def test_specs_from_table() -> None:
    table = {"row_softmax": {"signature": SIG, "constexprs": {"BLOCK": 1024},
                             "options": {"num_warps": 8}},
             "neg": {"signature": SIG, "constexprs": {"BLOCK": 8192},
                     "options": {"num_warps": 1}, "expect_spill": True}}
    specs = specs_from_table("spill_kernels", table, ["sm_80", "sm_90a"])
    assert [(s.kernel, s.arch, s.num_warps, s.expect_spill) for s in specs] == [
        ("spill_kernels:row_softmax", "sm_80", 8, False),
        ("spill_kernels:row_softmax", "sm_90a", 8, False),
        ("spill_kernels:neg", "sm_80", 1, True),
        ("spill_kernels:neg", "sm_90a", 1, True)]
    with pytest.raises(SpillError, match=r"unknown keys \['num_wraps'\]"):
        specs_from_table("m", {"k": {"signature": SIG, "options": {"num_wraps": 4}}}, ["sm_80"])


def test_retarget_and_summarize() -> None:
    ptx = ".version 8.7\n.target sm_90a\n.address_size 64\n"
    assert retarget_ptx(ptx, "sm_90") == ".version 8.7\n.target sm_90\n.address_size 64\n"
    assert retarget_ptx(ptx, "sm_90a") == ptx
    assert summarize("a\nb\n\nc\nd\ne", head=2) == "a | b | … | e"
    assert summarize("a\nb\nc", head=2) == "a | b | c"


# --- real compiles -----------------------------------------------------------------------

@needs_triton
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_block_1024_does_not_spill(arch: str, request: pytest.FixtureRequest) -> None:
    report = compile_and_measure(softmax_spec(1024, arch), cache_dir=None, search_path=SEARCH)
    record(request, report)
    assert (report.spill_store_bytes, report.spill_load_bytes, report.stack_frame_bytes) \
        == (0, 0, 0)
    assert 16 <= report.registers < 64, report.registers
    assert report.entry == "row_softmax" and report.cached is False
    assert report.spec.arch in report.ptxas_log  # "Compiling entry function ... for 'sm_80'"
    assert re.fullmatch(r".*release \d+\.\d+, V[\d.]+.*", report.ptxas_version)
    assert report.verdict().passed, report.verdict().message


@needs_triton
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_spilling_config_fails_the_gate(arch: str, shared_cache: Path,
                                        request: pytest.FixtureRequest) -> None:
    report = compile_and_measure(spilling_spec(arch), cache_dir=shared_cache,
                                 search_path=SEARCH)
    record(request, report)
    verdict = report.verdict()
    assert not verdict.passed and report.over_budget
    m = re.fullmatch(r"spilled (\d+) bytes stores \+ (\d+) bytes loads > budget 0 "
                     r"\(registers (\d+), stack (\d+)\)", verdict.message)
    assert m, verdict.message
    numbers = tuple(int(g) for g in m.groups())
    assert numbers == (report.spill_store_bytes, report.spill_load_bytes, report.registers,
                       report.stack_frame_bytes)
    assert min(numbers) > 0


@needs_triton
def test_negative_control(shared_cache: Path, compiles: list[str]) -> None:
    # The declared negative control passes because it spills...
    control = compile_and_measure(spilling_spec("sm_90a", expect_spill=True),
                                  cache_dir=shared_cache, search_path=SEARCH)
    assert control.verdict().passed, control.verdict().message
    assert control.verdict().message.startswith("negative control spilled ")
    # ...a budget that covers the spill passes too, and re-gating compiles nothing...
    before = len(compiles)
    roomy = compile_and_measure(spilling_spec("sm_90a", budget_bytes=control.spilled_bytes),
                                cache_dir=shared_cache, search_path=SEARCH)
    assert roomy.cached and len(compiles) == before and roomy.verdict().passed
    # ...and a "negative control" that does not spill fails: it would prove nothing.
    clean = compile_and_measure(softmax_spec(1024, "sm_90a", expect_spill=True),
                                cache_dir=shared_cache, search_path=SEARCH)
    assert not clean.verdict().passed
    assert "did not spill" in clean.verdict().message


@needs_triton
def test_fp_fusion_is_the_installed_tritons_default_passed_explicitly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Triton 3.9 warns at every compile that leaves enable_fp_fusion unset (warnings are
    # errors here), so the gate passes Triton's own default, TRITON_DEFAULT_FP_FUSION
    # included; the PTX shows which way it went, and the digest keeps the two apart.
    spec = SpillSpec(kernel="spill_kernels:scale_shift",
                     signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "a": "fp32", "b": "fp32",
                                "n": "i32", "BLOCK": "constexpr"},
                     constexprs={"BLOCK": 128}, arch="sm_90a")
    reports = {}
    for env in (None, "0"):
        if env is None:
            monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION", raising=False)
        else:
            monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", env)
        report = compile_and_measure(spec, cache_dir=tmp_path, search_path=SEARCH)
        assert report.ptx_path is not None and not report.cached
        reports[env] = (report.digest, Path(report.ptx_path).read_text(encoding="utf-8"))
    assert "fma.rn.f32" in reports[None][1]  # fused by default on Triton 3.6 to 3.9
    assert "fma.rn.f32" not in reports["0"][1] and "mul.rn.f32" in reports["0"][1]
    assert reports[None][0] != reports["0"][0]


@needs_triton
def test_cache_second_call_compiles_nothing(tmp_path: Path, compiles: list[str]) -> None:
    spec = softmax_spec(1024, "sm_90a")
    first = compile_and_measure(spec, cache_dir=tmp_path, search_path=SEARCH)
    assert compiles == ["row_softmax"] and not first.cached
    second = compile_and_measure(spec, cache_dir=tmp_path, search_path=SEARCH)
    assert compiles == ["row_softmax"] and second.cached
    numbers = ("registers", "stack_frame_bytes", "spill_store_bytes", "spill_load_bytes",
               "shared_bytes", "entry", "digest", "compile_seconds", "ptxas_log")
    assert [getattr(second, n) for n in numbers] == [getattr(first, n) for n in numbers]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{first.digest}.json",
                                                          f"{first.digest}.ptx"]
    assert Path(str(second.ptx_path)).read_text().startswith("//")  # PTX, as measured
    # Another arch is another entry.
    compile_and_measure(softmax_spec(1024, "sm_80"), cache_dir=tmp_path, search_path=SEARCH)
    assert len(compiles) == 2


def _garbage(path: Path) -> None:
    path.write_text("{not json")


def _wrong_shape(path: Path) -> None:
    entry = json.loads(path.read_text())
    del entry["stats"]["registers"]
    path.write_text(json.dumps(entry))


def _negative(path: Path) -> None:
    entry = json.loads(path.read_text())
    entry["stats"]["spill_store_bytes"] = -1
    path.write_text(json.dumps(entry))


def _ptx_edited(path: Path) -> None:
    ptx = path.with_suffix(".ptx")
    ptx.write_text(ptx.read_text() + "\n// edited\n")


def _ptx_missing(path: Path) -> None:
    path.with_suffix(".ptx").unlink()


@needs_triton
@pytest.mark.parametrize("corrupt", [_garbage, _wrong_shape, _negative, _ptx_edited,
                                     _ptx_missing])
def test_corrupt_cache_entry_is_ignored_and_rewritten(
        corrupt: Callable[[Path], None], tmp_path: Path, compiles: list[str]) -> None:
    spec = softmax_spec(1024, "sm_80")
    first = compile_and_measure(spec, cache_dir=tmp_path, search_path=SEARCH)
    corrupt(tmp_path / f"{first.digest}.json")
    again = compile_and_measure(spec, cache_dir=tmp_path, search_path=SEARCH)
    assert not again.cached and len(compiles) == 2
    assert again.registers == first.registers
    third = compile_and_measure(spec, cache_dir=tmp_path, search_path=SEARCH)
    assert third.cached and len(compiles) == 2  # the rewritten entry is good


@needs_triton
def test_editing_the_kernel_module_invalidates(tmp_path: Path, compiles: list[str]) -> None:
    module = tmp_path / "spill_edited_kernels.py"
    shutil.copy(RESOURCES / "spill_kernels.py", module)
    spec = SpillSpec(kernel="spill_edited_kernels:row_softmax", signature=SIG,
                     constexprs={"BLOCK": 1024}, arch="sm_80")
    cache, search = tmp_path / "cache", [str(tmp_path)]
    first = compile_and_measure(spec, cache_dir=cache, search_path=search)
    assert compile_and_measure(spec, cache_dir=cache, search_path=search).cached
    # exp -> exp2 changes the code, so the new PTX shows the edited module was compiled.
    module.write_text(module.read_text().replace("tl.exp(x - m)", "tl.exp2(x - m)"))
    edited = compile_and_measure(spec, cache_dir=cache, search_path=search)
    assert not edited.cached and len(compiles) == 2 and edited.digest != first.digest
    assert Path(str(edited.ptx_path)).read_text() != Path(str(first.ptx_path)).read_text()


@needs_triton
def test_a_module_shadowed_on_the_search_path_is_the_one_compiled(tmp_path: Path) -> None:
    # Two files named spill_shadow_kernels.py; the search path decides which one counts.
    ptx = []
    for folder, unary in (("a", "tl.exp(x - m)"), ("b", "tl.exp2(x - m)")):
        (tmp_path / folder).mkdir()
        text = (RESOURCES / "spill_kernels.py").read_text().replace("tl.exp(x - m)", unary)
        (tmp_path / folder / "spill_shadow_kernels.py").write_text(text)
        spec = SpillSpec(kernel="spill_shadow_kernels:row_softmax", signature=SIG,
                         constexprs={"BLOCK": 1024}, arch="sm_80")
        report = compile_and_measure(spec, cache_dir=tmp_path / "cache",
                                     search_path=[str(tmp_path / folder)])
        ptx.append(Path(str(report.ptx_path)).read_text())
    assert ptx[0] != ptx[1]


@needs_triton
def test_every_arch_assembles(request: pytest.FixtureRequest) -> None:
    # ARCHS is only honest if Triton and its ptxas accept each one.
    for arch in ARCHS:
        report = compile_and_measure(softmax_spec(1024, arch), cache_dir=None,
                                     search_path=SEARCH)
        assert report.verdict().passed and f"for '{arch}'" in report.ptxas_log, arch
        record(request, report)


@needs_triton
def test_autotune_specs_expand_the_configs() -> None:
    base = softmax_spec(1024, "sm_90a", kernel="row_softmax_tuned")
    specs = autotune_specs(base, SEARCH)
    assert [(s.constexprs["BLOCK"], s.num_warps, s.num_stages) for s in specs] == [
        (1024, 4, 3), (2048, 8, 2)]
    report = compile_and_measure(specs[1], cache_dir=None, search_path=SEARCH)
    assert report.entry == "row_softmax" and report.verdict().passed
    with pytest.raises(SpillError, match=re.escape("is not @triton.autotune'd")):
        autotune_specs(softmax_spec(), SEARCH)


# --- errors users see --------------------------------------------------------------------

@needs_triton
@pytest.mark.parametrize(("spec", "needle"), [
    (SpillSpec(kernel="no_such_module_xyz:k", signature=SIG, constexprs={"BLOCK": 1024},
               arch="sm_80"), "cannot import kernel module 'no_such_module_xyz': not found"),
    (softmax_spec(kernel="nope"), "module 'spill_kernels' has no attribute 'nope'"),
    (softmax_spec(kernel="not_a_kernel"), "is a function, not a @triton.jit function"),
    (softmax_spec(kernel="ROW_SOFTMAX_SIGNATURE"), "is a dict, not a @triton.jit function"),
    (softmax_spec(1000), "failed to compile: CompilationError: at 3:11: | "),
    (SpillSpec(kernel="spill_kernels:row_softmax", arch="sm_80", constexprs={"BLOCK": 1024},
               signature={k: v for k, v in SIG.items() if k != "stride"}),
     "missing ['stride'], unknown []"),
    (SpillSpec(kernel="spill_kernels:row_softmax", arch="sm_80", constexprs={"BLOCK": 1024},
               signature={**SIG, "x_ptr": "*fq32"}), "failed to compile: KeyError: 'fq32'"),
])
def test_errors(spec: SpillSpec, needle: str) -> None:
    with pytest.raises(SpillError) as info:
        compile_and_measure(spec, cache_dir=None, search_path=SEARCH)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)  # one line for users


@needs_triton
def test_compile_error_names_the_cause() -> None:
    with pytest.raises(SpillError, match=r"arange's range must be a power of 2$"):
        compile_and_measure(softmax_spec(1000), cache_dir=None, search_path=SEARCH)


@needs_triton
def test_module_that_fails_to_import(tmp_path: Path) -> None:
    (tmp_path / "spill_broken_kernels.py").write_text("raise RuntimeError('boom')\n")
    spec = SpillSpec(kernel="spill_broken_kernels:k", signature=SIG,
                     constexprs={"BLOCK": 1024}, arch="sm_80")
    with pytest.raises(SpillError, match="cannot import kernel module 'spill_broken_kernels': "
                                         "RuntimeError: boom"):
        compile_and_measure(spec, cache_dir=None, search_path=[str(tmp_path)])


@needs_triton
@pytest.mark.parametrize(("ptxas", "needle"), [
    ("/nonexistent/ptxas", "ptxas missing: cannot run '/nonexistent/ptxas'"),
    ("/bin/false", "ptxas at '/bin/false' failed to report its version"),
])
def test_ptxas_missing_or_broken(ptxas: str, needle: str) -> None:
    with pytest.raises(SpillError, match=re.escape(needle)):
        compile_and_measure(softmax_spec(), cache_dir=None, search_path=SEARCH, ptxas=ptxas)


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env}, check=False)


def test_triton_missing_is_one_clear_line() -> None:
    proc = _run_python(f"""
        import sys
        sys.modules["triton"] = None  # import triton now raises ImportError
        from cpmatrix.spill import SpillError, SpillSpec, compile_and_measure
        assert "torch" not in sys.modules  # the gate's package imports neither
        spec = SpillSpec(kernel="spill_kernels:row_softmax", signature={SIG!r},
                         constexprs={{"BLOCK": 1024}}, arch="sm_80")
        try:
            compile_and_measure(spec, cache_dir=None, search_path=[{str(RESOURCES)!r}])
        except SpillError as e:
            print(e)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ("triton is not installed; spill gates need it: "
                           "pip install cpmatrix[kernels]\n")


@needs_triton
def test_interpreter_mode_is_refused() -> None:
    proc = _run_python(f"""
        from cpmatrix.spill import SpillError, SpillSpec, compile_and_measure
        spec = SpillSpec(kernel="spill_kernels:row_softmax", signature={SIG!r},
                         constexprs={{"BLOCK": 1024}}, arch="sm_80")
        try:
            compile_and_measure(spec, cache_dir=None, search_path=[{str(RESOURCES)!r}])
        except SpillError as e:
            print(e)
    """, TRITON_INTERPRET="1")
    assert proc.returncode == 0, proc.stderr
    assert "decorated under TRITON_INTERPRET=1" in proc.stdout


# --- the reference suite's kernels ------------------------------------------------------

def _suite_modules() -> list[str]:
    if not SUITE_KERNELS.is_dir():
        return []
    # A module-level assignment, found without importing (that needs torch and triton).
    declares = re.compile(r"^SPILL_SPECS\b.*=", flags=re.MULTILINE)
    return sorted(p.stem for p in SUITE_KERNELS.glob("*.py")
                  if declares.search(p.read_text(encoding="utf-8")))


def test_suite_kernel_modules_are_found() -> None:
    # If the folder moved or the table stopped matching, the gate below would vanish.
    assert _suite_modules() == ["layernorm", "softmax"]


@needs_triton
@pytest.mark.parametrize("module", _suite_modules())
def test_suite_kernels_do_not_spill(module: str, request: pytest.FixtureRequest) -> None:
    name = f"cpmatrix.suite.kernels.{module}"
    table = importlib.import_module(name).SPILL_SPECS
    specs = specs_from_table(name, table, ["sm_80", "sm_90a"])
    assert specs, f"{name}.SPILL_SPECS is empty"
    failures = []
    for spec in specs:
        report = compile_and_measure(spec, cache_dir=None)
        record(request, report)
        if not report.verdict().passed:
            failures.append(f"{spec.label}: {report.verdict().message}")
    assert not failures, failures


# --- on a GPU ---------------------------------------------------------------------------

@needs_triton
def test_crosscheck_loaded() -> None:
    import torch

    result = crosscheck_loaded(softmax_spec(1024, "sm_90a"), search_path=SEARCH)
    if not torch.cuda.is_available():
        assert result == {"skipped": "no CUDA device"}
        return
    assert result["match"], result
    spilled = crosscheck_loaded(spilling_spec("sm_90a"), search_path=SEARCH)
    assert spilled["loaded_local_bytes"] == spilled["ptxas_stack_frame_bytes"] > 0, spilled
