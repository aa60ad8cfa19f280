"""``cpmatrix list`` and ``cpmatrix show`` through the real CLI: output and exit codes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cli_runner import run_cli
from cpmatrix.cli import main
from cpmatrix.matrix.expand import expand
from cpmatrix.matrix.load import load_matrix

RESOURCES = Path(__file__).parents[1] / "resources"
GRID = RESOURCES / "grid.yaml"
GRID_CELLS = expand(load_matrix(GRID)).cells
#: What list says after the count: the combinations the exclude clause and a constraint left out.
LEFT_OUT = ("; 28 combination(s) left out: 16 by exclude[0], 12 by constraint "
            "autocast-needs-reduced-precision (--why-excluded lists them)")
JSON_KEYS = {"id", "target", "level", "mesh", "world_size", "dtype", "autocast", "path",
             "platform", "tags", "timeout_s", "digest", "params"}


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


def test_list_prints_every_cell_id(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = cli(capsys, "list", "--matrix", str(GRID))
    assert rc == 0
    assert out.splitlines() == [c.id for c in GRID_CELLS]
    assert err == f"{len(GRID_CELLS)} of {len(GRID_CELLS)} cells selected{LEFT_OUT}\n"


def test_list_json_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = cli(capsys, "list", "--json", "--matrix", str(GRID))
    assert rc == 0
    cells = json.loads(out)
    assert [c["id"] for c in cells] == [c.id for c in GRID_CELLS]
    for got in cells:
        assert set(got) >= JSON_KEYS, JSON_KEYS - set(got)
        rows, cols = (int(n) for n in got["mesh"].split("x"))
        assert got["world_size"] == rows * cols
        assert isinstance(got["autocast"], bool) and isinstance(got["timeout_s"], int)
        assert len(got["digest"]) == 64
    ring = next(c for c in cells if c["id"] == (
        "ring_attention[unit,1x2,bf16,autocast=on,kernel,seq=7]@cuda"))
    assert {k: ring[k] for k in JSON_KEYS - {"digest"}} == {
        "id": "ring_attention[unit,1x2,bf16,autocast=on,kernel,seq=7]@cuda",
        "target": "ring_attention", "level": "unit", "mesh": "1x2", "world_size": 2,
        "dtype": "bf16", "autocast": True, "path": "kernel", "platform": "cuda",
        "tags": ["attention", "fast"], "timeout_s": 60, "params": {"seq": 7},
    }
    step = next(c for c in cells if c["target"] == "workflow_step")
    assert step["params"] == {"causal": True, "mode": "a"} and step["timeout_s"] == 900


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--platform", "cuda"], [c.id for c in GRID_CELLS if c.platform == "cuda"]),
        (["-k", "allgather and 2x2"], ["allgather[layer,2x2,fp64,autocast=off,reference]@cpu",
                                       "allgather[layer,2x2,fp32,autocast=off,reference]@cpu"]),
        (["-k", "(slow or collective) and not fp32 and not causal=true"],
         ["allgather[layer,1x2,fp64,autocast=off,reference]@cpu",
          "allgather[layer,2x2,fp64,autocast=off,reference]@cpu",
          "workflow_step[workflow,2x2,fp64,autocast=off,reference,causal=false,mode=a]@cpu",
          "workflow_step[workflow,2x2,fp64,autocast=off,reference,causal=false,mode=b.c]@cpu",
          "workflow_step[workflow,2x2,fp64,autocast=off,reference,causal=false,mode=a]@cuda",
          "workflow_step[workflow,2x2,fp64,autocast=off,reference,causal=false,mode=b.c]@cuda"]),
        (["--tag", "fast", "--platform", "cpu", "-k", "2x3"],
         ["ring_attention[unit,2x3,bf16,autocast=on,kernel,seq=7]@cpu"]),
        (["--tag", "attention", "--tag", "fast", "-k", "1x1 and seq=64 and not bf16"],
         ["ring_attention[unit,1x1,fp32,autocast=off,reference,seq=64]@cpu",
          "ring_attention[unit,1x1,fp32,autocast=off,reference,seq=64]@cuda"]),
    ],
    ids=["platform", "k-and", "k-or-not-parens", "tag-platform-k", "two-tags-and-k"],
)
def test_list_selects(
    args: list[str], expected: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = cli(capsys, "list", "--matrix", str(GRID), *args)
    assert rc == 0, err
    assert out.splitlines() == expected
    assert err == f"{len(expected)} of {len(GRID_CELLS)} cells selected{LEFT_OUT}\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-k", "nothing_like_this"],
         f"nothing selected: -k 'nothing_like_this' matched none of the {len(GRID_CELLS)} cells"),
        (["--tag", "nightly"], "nothing selected: --tag nightly matched none"),
        (["--platform", "cuda", "-k", "allgather"],
         "nothing selected: --platform cuda and -k 'allgather' matched none"),
    ],
    ids=["k", "tag", "platform-and-k"],
)
def test_empty_selection_exits_3_and_says_why(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = cli(capsys, "list", "--matrix", str(GRID), *args)
    assert (rc, out) == (3, "")
    assert err.startswith(message), err
    assert str(GRID) in err


def test_matrix_with_no_cell_exits_3_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "tiny.py").write_text("def ok(cell):\n    return None\n")
    path = tmp_path / "m.yaml"
    path.write_text("""\
version: 1
pythonpath: [cases]
platforms: {cpu: {backend: gloo, device: cpu}}
targets:
  - {name: a, case: "tiny:ok", level: unit, axes: {dtype: [fp32, fp64], path: kernel}}
exclude:
  - {dtype: fp32}
""")
    rc, out, err = cli(capsys, "list", "--matrix", str(path))
    assert (rc, out) == (3, "")
    assert err == (f"nothing selected: {path} yields no cell: all 2 combinations were excluded"
                   " (see `cpmatrix list --why-excluded`)\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-k", "ring and"], "error: -k 'ring and': expected a word or '(' at column 9"),
        (["-k", "(ring"], "error: -k '(ring': expected ')' at column 6"),
        (["-k", ""], "error: -k: empty expression"),
        (["--platform", "tpu"],
         "error: --platform 'tpu': unknown (allowed: cpu, cuda); did you mean 'cpu'?"),
    ],
    ids=["k-dangling-and", "k-open-paren", "k-empty", "unknown-platform"],
)
def test_bad_selection_exits_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = cli(capsys, "list", "--matrix", str(GRID), *args)
    assert (rc, out) == (2, "")
    assert err == message + "\n"


@pytest.mark.parametrize(
    "argv", [[], ["list", "--bogus"], ["frobnicate"], ["show"]], ids=str
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = cli(capsys, *argv)
    assert (rc, out) == (2, "")
    assert "usage: cpmatrix" in err and "error: " in err and "Traceback" not in err


def test_why_excluded_names_each_reason(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = cli(capsys, "list", "--why-excluded", "--matrix", str(GRID))
    assert rc == 0
    cells, _, tail = out.partition("\n\n")
    assert cells.splitlines() == [c.id for c in GRID_CELLS]
    header, *rows = tail.splitlines()
    assert header == f"{len(rows)} combinations excluded:"
    reasons = dict(row.strip().split("  <- ") for row in rows)
    exclude_line = line_of(GRID.read_text(), "- {target: ring_attention, mesh: 1x1, path: kernel}")
    assert reasons["ring_attention[unit,1x1,bf16,autocast=off,kernel,seq=7]@cpu"] == (
        f"exclude[0] ({GRID}:{exclude_line})")
    assert reasons["ring_attention[unit,1x2,fp32,autocast=on,reference,seq=64]@cuda"] == (
        "constraint autocast-needs-reduced-precision: "
        "autocast=on only with a reduced-precision dtype (bf16, fp16)")
    assert not set(reasons) & {c.id for c in GRID_CELLS}
    assert {r.split(" ")[0] for r in reasons.values()} == {"exclude[0]", "constraint"}


def test_why_excluded_names_the_kernel_constraint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("""\
version: 1
platforms: {cpu: {backend: gloo, device: cpu}}
targets:
  - {name: a, case: "cpmatrix.matrix.schema:Mesh", level: unit,
     axes: {dtype: [fp64, fp32], path: kernel}}
""")
    rc, out, _ = cli(capsys, "list", "--why-excluded", "--matrix", str(path))
    assert rc == 0
    assert out == (
        "a[unit,1x1,fp32,autocast=off,kernel]@cpu\n\n1 combinations excluded:\n"
        "  a[unit,1x1,fp64,autocast=off,kernel]@cpu  <- constraint kernel-not-fp64: "
        "path=kernel never with fp64 (Triton kernels are fp32/bf16)\n"
    )


def test_why_excluded_with_json_keeps_stdout_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = cli(capsys, "list", "--json", "--why-excluded", "--matrix", str(GRID))
    assert rc == 0
    assert len(json.loads(out)) == len(GRID_CELLS)
    assert "combinations excluded:" in err and "<- exclude[0]" in err


def test_show_prints_one_cell(capsys: pytest.CaptureFixture[str]) -> None:
    cell = GRID_CELLS[-1]
    rc, out, _ = cli(capsys, "show", cell.id, "--matrix", str(GRID))
    assert rc == 0
    assert json.loads(out) == cell.to_dict()


@pytest.mark.parametrize(
    ("cell_id", "rc", "message"),
    [
        ("ring_attention[unit,1x1,fp32,autocast=off,kernel,seq=7]@cpu", 3,
         "ring_attention[unit,1x1,fp32,autocast=off,kernel,seq=7]@cpu: excluded by exclude[0]"),
        ("allgather[layer,3x3,fp64,autocast=off,reference]@cpu", 3,
         "no cell 'allgather[layer,3x3,fp64,autocast=off,reference]@cpu' in "),
        ("allgather[layer,3x3]@cpu", 2, "error: malformed cell id 'allgather[layer,3x3]@cpu'"),
    ],
    ids=["excluded", "absent", "malformed"],
)
def test_show_refuses(
    cell_id: str, rc: int, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    got, out, err = cli(capsys, "show", cell_id, "--matrix", str(GRID))
    assert (got, out) == (rc, "")
    assert err.startswith(message), err


def test_show_suggests_cells_of_the_same_target(capsys: pytest.CaptureFixture[str]) -> None:
    _, _, err = cli(capsys, "show", "allgather[layer,3x3,fp64,autocast=off,reference]@cpu",
                    "--matrix", str(GRID))
    first = "allgather[layer,1x2,fp64,autocast=off,reference]@cpu"
    assert f"cells of that target include: {first}, " in err


def test_exit_codes_in_a_real_process(tmp_path: Path) -> None:
    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*argv, cwd=tmp_path, timeout=120)

    ok = run("list", "--matrix", str(GRID), "-k", "allgather")
    assert ok.returncode == 0 and len(ok.stdout.splitlines()) == 4
    none = run("list", "--matrix", str(GRID), "-k", "zzz")
    assert none.returncode == 3 and "nothing selected" in none.stderr
    bad = run("list", "--matrix", str(GRID), "-k", "zzz and")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
