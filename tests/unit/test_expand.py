"""Expansion semantics: product order, exclude, include, constraints, platforms.

Each row is a small inline matrix and the cells it must expand to, in order, written
short as ``target:mesh,dtype,autocast,path[,k=v...][@platform]`` (``@cpu`` omitted).
"""

from __future__ import annotations

import doctest
from pathlib import Path
from types import ModuleType

import pytest

import cpmatrix.errors
import cpmatrix.matrix.cellid
import cpmatrix.matrix.expand
import cpmatrix.matrix.schema
import cpmatrix.matrix.select
from cpmatrix.cli import main
from cpmatrix.matrix.cellid import render_value
from cpmatrix.matrix.expand import CONSTRAINTS, Expansion, expand
from cpmatrix.matrix.load import parse_matrix
from cpmatrix.matrix.schema import Cell
from matrix_files import HEAD, write_matrix

PLATFORMS = """\
version: 1
platforms:
  cpu: {backend: gloo, device: cpu}
  cuda: {backend: nccl, device: cuda}
"""
CPU_ONLY = """\
version: 1
platforms:
  cpu: {backend: gloo, device: cpu}
"""


def source_of(module: str) -> bytes:
    """Case sources for the digest, without files: each module's name is its source."""
    return f"# module {module}\n".encode()


def run(text: str) -> Expansion:
    return expand(parse_matrix(text, file="m.yaml"), source_of)


def short(cell: Cell) -> str:
    params = "".join(f",{k}={render_value(v)}" for k, v in cell.params)
    at = "" if cell.platform == "cpu" else f"@{cell.platform}"
    autocast = "on" if cell.autocast else "off"
    return f"{cell.target}:{cell.mesh},{cell.dtype},{autocast},{cell.path}{params}{at}"


def t(name: str = "t", level: str = "unit", **fields: str) -> str:
    """A target as one flow-mapping line; ``fields`` are YAML snippets."""
    extra = "".join(f", {k}: {v}" for k, v in fields.items())
    return f'  - {{name: {name}, case: "cases_{name}:run", level: {level}{extra}}}\n'


EXPANSIONS = [
    # ------------------------------------------------------------------ product order
    pytest.param(
        CPU_ONLY + "targets:\n"
        + t(axes="{mesh: [2x2, 1x1], dtype: [bf16, fp32]}", params="{seq: [64, 7]}"),
        ["t:2x2,bf16,off,reference,seq=64", "t:2x2,bf16,off,reference,seq=7",
         "t:2x2,fp32,off,reference,seq=64", "t:2x2,fp32,off,reference,seq=7",
         "t:1x1,bf16,off,reference,seq=64", "t:1x1,bf16,off,reference,seq=7",
         "t:1x1,fp32,off,reference,seq=64", "t:1x1,fp32,off,reference,seq=7"],
        id="product-in-declared-order-params-last",
    ),
    pytest.param(
        CPU_ONLY + "targets:\n"
        + t(axes="{dtype: [bf16], autocast: [on, off], path: [kernel, reference]}",
            params="{n: [1, 2], causal: [true, false]}"),
        ["t:1x1,bf16,on,kernel,n=1,causal=true", "t:1x1,bf16,on,kernel,n=1,causal=false",
         "t:1x1,bf16,on,kernel,n=2,causal=true", "t:1x1,bf16,on,kernel,n=2,causal=false",
         "t:1x1,bf16,on,reference,n=1,causal=true", "t:1x1,bf16,on,reference,n=1,causal=false",
         "t:1x1,bf16,on,reference,n=2,causal=true", "t:1x1,bf16,on,reference,n=2,causal=false",
         "t:1x1,bf16,off,kernel,n=1,causal=true", "t:1x1,bf16,off,kernel,n=1,causal=false",
         "t:1x1,bf16,off,kernel,n=2,causal=true", "t:1x1,bf16,off,kernel,n=2,causal=false",
         "t:1x1,bf16,off,reference,n=1,causal=true", "t:1x1,bf16,off,reference,n=1,causal=false",
         "t:1x1,bf16,off,reference,n=2,causal=true", "t:1x1,bf16,off,reference,n=2,causal=false"],
        id="product-autocast-path-and-two-params",
    ),
    pytest.param(
        PLATFORMS.replace("  cpu: {backend: gloo, device: cpu}\n", "")
        + "  cpu: {backend: gloo, device: cpu}\n"
        + "targets:\n" + t("a", axes="{mesh: [1x1, 1x2]}") + t("b"),
        ["a:1x1,fp64,off,reference@cuda", "a:1x2,fp64,off,reference@cuda",
         "a:1x1,fp64,off,reference", "a:1x2,fp64,off,reference",
         "b:1x1,fp64,off,reference@cuda", "b:1x1,fp64,off,reference"],
        id="targets-in-file-order-platform-outermost",
    ),
    pytest.param(
        PLATFORMS + "defaults: {mesh: [1x2], dtype: [fp32]}\ntargets:\n"
        + t("a", axes="{dtype: [bf16]}") + t("b"),
        ["a:1x2,bf16,off,reference", "a:1x2,bf16,off,reference@cuda",
         "b:1x2,fp32,off,reference", "b:1x2,fp32,off,reference@cuda"],
        id="defaults-and-target-override",
    ),
    # --------------------------------------------------------------- platforms
    pytest.param(
        PLATFORMS + "targets:\n" + t("a", platforms="[cuda]") + t("b", platforms="cpu") + t("c"),
        ["a:1x1,fp64,off,reference@cuda", "b:1x1,fp64,off,reference",
         "c:1x1,fp64,off,reference", "c:1x1,fp64,off,reference@cuda"],
        id="platform-restrictions",
    ),
    # ----------------------------------------------------------------- exclude
    pytest.param(
        CPU_ONLY + "targets:\n"
        + t(axes="{mesh: [1x1, 2x2], dtype: [fp32, bf16]}", params="{seq: [7, 64]}")
        + "exclude:\n  - {mesh: 2x2, seq: 64}\n",
        ["t:1x1,fp32,off,reference,seq=7", "t:1x1,fp32,off,reference,seq=64",
         "t:1x1,bf16,off,reference,seq=7", "t:1x1,bf16,off,reference,seq=64",
         "t:2x2,fp32,off,reference,seq=7", "t:2x2,bf16,off,reference,seq=7"],
        id="exclude-partial-combination",
    ),
    pytest.param(
        CPU_ONLY + "targets:\n" + t(axes="{mesh: [1x1, 2x2], dtype: [fp64, fp32, bf16]}")
        + "exclude:\n  - {mesh: 2x2, dtype: [fp64, bf16]}\n  - {mesh: 1x1, dtype: fp32}\n",
        ["t:1x1,fp64,off,reference", "t:1x1,bf16,off,reference", "t:2x2,fp32,off,reference"],
        id="exclude-value-lists-and-several-clauses",
    ),
    pytest.param(
        PLATFORMS + "targets:\n" + t("a", axes="{dtype: [fp32, bf16]}")
        + t("b", level="layer", axes="{dtype: [fp32, bf16]}")
        + "exclude:\n  - {target: a, dtype: fp32}\n  - {level: layer, platform: cuda}\n",
        ["a:1x1,bf16,off,reference", "a:1x1,bf16,off,reference@cuda",
         "b:1x1,fp32,off,reference", "b:1x1,bf16,off,reference"],
        id="exclude-by-target-level-platform",
    ),
    pytest.param(
        CPU_ONLY + "targets:\n" + t("a", params="{seq: [7, 64]}") + t("b")
        + "exclude:\n  - {seq: 7}\n",
        ["a:1x1,fp64,off,reference,seq=64", "b:1x1,fp64,off,reference"],
        id="exclude-on-extra-axis-only-touches-targets-declaring-it",
    ),
    pytest.param(
        CPU_ONLY + "targets:\n" + t("a", params="{seq: [7, 64]}")
        + 'exclude:\n  - {seq: "7"}\n',
        ["a:1x1,fp64,off,reference,seq=64"],
        id="exclude-compares-values-as-text",
    ),
    # ----------------------------------------------------------------- include
    pytest.param(
        CPU_ONLY + "targets:\n" + t(axes="{mesh: [1x1, 2x2], dtype: [fp32, bf16]}")
        + "exclude:\n  - {mesh: 2x2}\ninclude:\n  - {mesh: 2x2, dtype: fp32}\n",
        ["t:1x1,fp32,off,reference", "t:1x1,bf16,off,reference", "t:2x2,fp32,off,reference"],
        id="include-brings-back-excluded-cell-in-place",
    ),
    pytest.param(
        CPU_ONLY + "targets:\n" + t(axes="{mesh: [1x1], dtype: [fp32, bf16]}",
                                    params="{seq: [7, 64]}")
        + "include:\n  - {target: t, mesh: 3x3}\n",
        ["t:1x1,fp32,off,reference,seq=7", "t:1x1,fp32,off,reference,seq=64",
         "t:1x1,bf16,off,reference,seq=7", "t:1x1,bf16,off,reference,seq=64",
         "t:3x3,fp32,off,reference,seq=7", "t:3x3,fp32,off,reference,seq=64",
         "t:3x3,bf16,off,reference,seq=7", "t:3x3,bf16,off,reference,seq=64"],
        id="include-left-out-axes-take-every-target-value",
    ),
    pytest.param(
        CPU_ONLY + "targets:\n" + t(axes="{mesh: [1x1, 1x2], dtype: [fp32]}", params="{seq: [7]}")
        + "include:\n  - {seq: [128, 256], dtype: bf16, mesh: 1x2}\n",
        ["t:1x1,fp32,off,reference,seq=7", "t:1x2,fp32,off,reference,seq=7",
         "t:1x2,bf16,off,reference,seq=128", "t:1x2,bf16,off,reference,seq=256"],
        id="include-adds-new-values",
    ),
    pytest.param(
        CPU_ONLY + "targets:\n" + t("a", params="{seq: [7]}") + t("b")
        + "include:\n  - {seq: 128}\n  - {dtype: bf16}\n",
        ["a:1x1,fp64,off,reference,seq=7", "a:1x1,fp64,off,reference,seq=128",
         "a:1x1,bf16,off,reference,seq=7",
         "b:1x1,fp64,off,reference", "b:1x1,bf16,off,reference"],
        id="include-without-target-applies-to-targets-declaring-its-axes",
    ),
    pytest.param(
        CPU_ONLY + "targets:\n" + t("a") + t("b", level="layer")
        + "include:\n  - {level: layer, mesh: 2x2}\n",
        ["a:1x1,fp64,off,reference", "b:1x1,fp64,off,reference", "b:2x2,fp64,off,reference"],
        id="include-by-level",
    ),
    pytest.param(
        CPU_ONLY + "targets:\n" + t(axes="{mesh: [1x1], dtype: [fp32, bf16]}")
        + "include:\n  - {dtype: fp32}\n  - {mesh: 1x1, dtype: [bf16, fp32]}\n"
        + "  - {mesh: 3x3}\n  - {mesh: 3x3, dtype: bf16}\n",
        ["t:1x1,fp32,off,reference", "t:1x1,bf16,off,reference",
         "t:3x3,fp32,off,reference", "t:3x3,bf16,off,reference"],
        id="include-duplicates-merged",
    ),
    pytest.param(
        PLATFORMS + "targets:\n" + t(platforms="[cpu]")
        + "include:\n  - {target: t, platform: [cuda, cpu], mesh: 3x3}\n",
        ["t:1x1,fp64,off,reference", "t:3x3,fp64,off,reference"],
        id="include-never-leaves-target-platforms",
    ),
    pytest.param(
        PLATFORMS + "targets:\n" + t()
        + "exclude:\n  - {platform: cuda}\ninclude:\n  - {platform: cuda, dtype: fp32}\n",
        ["t:1x1,fp64,off,reference", "t:1x1,fp32,off,reference@cuda"],
        id="include-by-platform",
    ),
    # ------------------------------------------------------------- constraints
    pytest.param(
        CPU_ONLY + "targets:\n" + t(axes="{dtype: [fp64, fp32, bf16, fp16], autocast: [off, on]}"),
        ["t:1x1,fp64,off,reference", "t:1x1,fp32,off,reference",
         "t:1x1,bf16,off,reference", "t:1x1,bf16,on,reference",
         "t:1x1,fp16,off,reference", "t:1x1,fp16,on,reference"],
        id="constraint-autocast-only-with-reduced-precision",
    ),
    pytest.param(
        CPU_ONLY + "targets:\n" + t(axes="{dtype: [fp64, fp32, bf16], path: [reference, kernel]}"),
        ["t:1x1,fp64,off,reference", "t:1x1,fp32,off,reference", "t:1x1,fp32,off,kernel",
         "t:1x1,bf16,off,reference", "t:1x1,bf16,off,kernel"],
        id="constraint-kernel-never-fp64",
    ),
    pytest.param(
        CPU_ONLY + "targets:\n" + t(axes="{dtype: [fp32]}")
        + "include:\n  - {autocast: on}\n  - {dtype: fp64, path: kernel}\n"
        + "  - {dtype: bf16, autocast: on, path: kernel}\n",
        ["t:1x1,fp32,off,reference", "t:1x1,bf16,on,kernel"],
        id="constraints-apply-to-includes",
    ),
]


@pytest.mark.parametrize(("text", "expected"), EXPANSIONS)
def test_expansion(text: str, expected: list[str]) -> None:
    assert [short(c) for c in run(text).cells] == expected


def test_exclusions_are_reported_with_their_reason() -> None:
    text = (
        CPU_ONLY + "targets:\n"
        + t(axes="{mesh: [1x1, 2x2], dtype: [fp64, bf16], autocast: [off, on]}")
        + "exclude:\n  - {mesh: 2x2}\ninclude:\n  - {mesh: 2x2, dtype: fp64, autocast: on}\n"
    )
    reasons = {e.id: e.reason for e in run(text).excluded}
    prefix = "t[unit,"
    assert reasons == {
        prefix + "1x1,fp64,autocast=on,reference]@cpu":
            "constraint autocast-needs-reduced-precision: "
            "autocast=on only with a reduced-precision dtype (bf16, fp16)",
        prefix + "2x2,fp64,autocast=off,reference]@cpu": "exclude[0] (m.yaml:7)",
        # Brought back by the include, then refused by the constraint: the constraint wins.
        prefix + "2x2,fp64,autocast=on,reference]@cpu":
            "constraint autocast-needs-reduced-precision: "
            "autocast=on only with a reduced-precision dtype (bf16, fp16)",
        prefix + "2x2,bf16,autocast=off,reference]@cpu": "exclude[0] (m.yaml:7)",
        prefix + "2x2,bf16,autocast=on,reference]@cpu": "exclude[0] (m.yaml:7)",
    }


def test_constraints_are_the_documented_two() -> None:
    assert [c.name for c in CONSTRAINTS] == [
        "autocast-needs-reduced-precision", "kernel-not-fp64"
    ]


def test_cells_carry_target_fields() -> None:
    text = PLATFORMS + "targets:\n" + t(
        level="module", tags="[x, y]", timeout="long", kind="property",
        axes="{mesh: [2x3]}", params="{seq: [7]}",
    )
    cpu, cuda = run(text).cells
    assert (cpu.platform, cuda.platform) == ("cpu", "cuda")
    assert cpu.case == "cases_t:run" and cpu.kind == "property" and cpu.level == "module"
    assert cpu.world_size == 6 and cpu.timeout_s == 900 and cpu.tags == ("x", "y")
    assert cpu.params == (("seq", 7),)
    assert cpu.id == "t[module,2x3,fp64,autocast=off,reference,seq=7]@cpu"
    assert cpu.digest != cuda.digest


def test_an_included_cell_equals_the_product_cell() -> None:
    base = CPU_ONLY + "targets:\n" + t(axes="{dtype: [fp32, bf16]}")
    plain = run(base).cells
    again = run(base + "exclude:\n  - {dtype: bf16}\ninclude:\n  - {dtype: bf16}\n").cells
    assert plain == again
    assert [c.digest for c in plain] == [c.digest for c in again]


def test_expansion_is_deterministic_and_reads_each_module_once() -> None:
    text = CPU_ONLY + "targets:\n" + t("a", params="{seq: [1, 2, 3]}") + t("b") + t(
        "c", params="{n: [4]}").replace("cases_c", "cases_a")
    reads: list[str] = []

    def counting(module: str) -> bytes:
        reads.append(module)
        return source_of(module)

    matrix = parse_matrix(text)
    first = expand(matrix, counting)
    assert sorted(reads) == ["cases_a", "cases_b"]
    second = expand(matrix, source_of)
    assert first == second
    assert [c.digest for c in first.cells] == [c.digest for c in second.cells]


# ------------------------------------------- bad input found by expansion (real CLI)



EXPAND_ERRORS = [
    pytest.param(
        HEAD + 'targets:\n  - {name: a, case: "tiny:ok", level: unit, params: {seq: [7]}}\n'
        "include:\n  - {target: a, seq: 128}\n  - {target: a, seq: '128'} #!\n",
        "include[1].seq",
        ("two cells with the same id", "'128'", "128"),
        id="two-includes-render-alike",
    ),
    pytest.param(
        HEAD + 'targets:\n  - {name: a, case: "tiny:ok", level: unit}\n'
        "include:\n  - {target: a, level: layer, dtype: fp32} #!\n",
        "include[0]", ("applies to no target",), id="include-applies-to-nothing",
    ),
    pytest.param(
        HEAD + 'targets:\n  - {name: a, case: "tiny:ok", level: unit}\n'
        "include:\n  - {target: a, dtype: fp32}\n  - {level: module} #!\n",
        "include[1]", ("include[1] applies to no target",), id="include-wrong-level",
    ),
    pytest.param(
        HEAD + "targets:\n  - name: a\n    level: unit\n    case: nosuch.mod:run #!\n",
        "targets[0].case",
        ("case module of 'nosuch.mod:run' not found", "module 'nosuch.mod' not found"),
        id="case-module-not-found",
    ),
    pytest.param(
        HEAD + 'targets:\n  - {name: a, case: "tiny:ok", level: unit}\n'
        "  - {name: b, case: gone:run, level: unit, axes: {dtype: fp32, autocast: on}} #!\n",
        "targets[1].case", ("case module of 'gone:run' not found",),
        id="case-module-not-found-even-if-every-cell-is-excluded",
    ),
]


@pytest.mark.parametrize(("text", "yaml_path", "fragments"), EXPAND_ERRORS)
def test_bad_input_found_by_expansion_exits_2(
    text: str, yaml_path: str, fragments: tuple[str, ...], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = write_matrix(tmp_path, text)
    line = next(n for n, s in enumerate(text.splitlines(), 1) if "#!" in s)
    assert main(["list", "--matrix", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {path}:{line}:"), err
    assert f": {yaml_path}: " in err, err
    for fragment in fragments:
        assert fragment in err, (err, fragment)


def test_case_module_error_points_at_the_case_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = HEAD + "targets:\n  - name: a\n    level: unit\n    case: nosuch:run\n"
    path = write_matrix(tmp_path, text)
    assert main(["list", "--matrix", str(path)]) == 2
    column = "    case: nosuch:run".index("nosuch") + 1
    assert capsys.readouterr().err.startswith(f"error: {path}:8:{column}: targets[0].case: ")


@pytest.mark.parametrize(
    "module",
    [cpmatrix.matrix.schema, cpmatrix.errors, cpmatrix.matrix.cellid, cpmatrix.matrix.expand,
     cpmatrix.matrix.select],
    ids=lambda m: m.__name__,
)
def test_docstring_examples_hold(module: ModuleType) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
