"""The CLI's habits: --version, help with examples, did-you-mean for flags, values and
``-k`` words, torch's dtype spellings, YAML errors in words, the cells each constraint
removed, a missing case function caught before any world (in process: ``main``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpmatrix import __version__
from cpmatrix.cli import COMMANDS, build_parser, main
from cpmatrix.errors import UsageError

CASES = "def f(cell):\n    pass\n\ndef g(cell):\n    pass\n"
MATRIX = """\
version: 1
pythonpath: ["."]
platforms: {cpu: {backend: gloo, device: cpu}}
targets:
  - name: allreduce_sum
    case: cases:f
    level: unit
    axes: {mesh: [1x2, 2x2], dtype: [fp64, bf16], autocast: [off, on]}
"""


def write_matrix_and_cases(folder: Path, matrix: str, cases: str) -> Path:
    (folder / "cases.py").write_text(cases)
    path = folder / "m.yaml"
    path.write_text(matrix)
    return path


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def matrix(tmp_path: Path) -> Path:
    return write_matrix_and_cases(tmp_path, MATRIX, CASES)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"cpmatrix {__version__}\n"


def test_help_describes_the_tool_and_each_command_has_examples() -> None:
    parser = build_parser()
    top = parser.format_help()
    assert "multi-rank PyTorch parity tests" in top and "cpmatrix init" in top
    assert "one small module per subcommand" not in top  # no implementation note
    commands = parser.parse_args(["config"]).parsers
    assert set(commands) == {c for m in COMMANDS for c in ("run", "spill")
                             if m.__name__.endswith(".run")} | {
        m.__name__.rsplit(".", 1)[1].replace("config_cmd", "config") for m in COMMANDS}
    for name, sub in commands.items():
        text = sub.format_help()
        assert "examples:" in text and f"cpmatrix {name}" in text.split("examples:")[1], name
    assert "torchrun worlds" not in commands["run"].format_help()
    assert "fork" in commands["run"].format_help()


def test_repro_help_offers_no_flag_that_means_nothing_for_it() -> None:
    text = build_parser().parse_args(["config"]).parsers["repro"].format_help()
    for flag in ("--shard", "--scheduler", "--partition", "--max-jobs", "--slurm-arg",
                 "--durations", "--maxfail", "--jobs", "--batch-size", "--remote-cache"):
        assert flag not in text, flag
    for flag in ("--failed", "-k", "--runner", "--mutant", "--matrix"):
        assert flag in text, flag


@pytest.mark.parametrize(("argv", "hint"), [
    (["list", "--platfrom", "cpu"], "did you mean '--platform'?"),
    (["run", "--maxfial", "1"], "did you mean '--maxfail'?"),
    (["rnu"], "did you mean 'run'?"),
    (["run", "--launcher", "forkk"], "did you mean 'fork'?"),
], ids=["list-flag", "run-flag", "command", "choice"])
def test_a_typo_is_exit_2_with_the_nearest_word(
        capsys: pytest.CaptureFixture[str], matrix: Path, argv: list[str], hint: str) -> None:
    rc, out, err = cli(capsys, *argv, "--matrix", str(matrix))
    assert (rc, out) == (2, "")
    assert hint in err and "Traceback" not in err, err
    if argv[0] == "list":  # the usage line is the command's, not the top level's
        assert "usage: cpmatrix list" in err


def test_a_k_word_matching_no_cell_names_the_nearest(
        capsys: pytest.CaptureFixture[str], matrix: Path) -> None:
    rc, _, err = cli(capsys, "list", "--matrix", str(matrix), "-k", "allreduce_sun")
    assert rc == 3
    assert "-k word 'allreduce_sun' matches no cell (did you mean 'allreduce_sum'?)" in err
    rc, _, err = cli(capsys, "list", "--matrix", str(matrix), "-k", "float64")
    assert rc == 3 and "did you mean 'fp64'? torch's float64 is fp64 here" in err
    # one word matches, the other does not: the cells are listed, the typo noted
    rc, out, err = cli(capsys, "list", "--matrix", str(matrix), "-k", "2x2 or bf61")
    assert rc == 0 and out and "-k word 'bf61' matches no cell (did you mean 'bf16'?)" in err


def test_torch_dtype_spellings_are_accepted_in_the_matrix(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_matrix_and_cases(
        tmp_path, MATRIX.replace("[fp64, bf16]", "[float64, torch.bfloat16]"), CASES)
    rc, out, err = cli(capsys, "list", "--matrix", str(path))
    assert rc == 0, err
    assert "allreduce_sum[unit,1x2,fp64,autocast=off,reference]@cpu" in out.split()
    assert "allreduce_sum[unit,1x2,bf16,autocast=on,reference]@cpu" in out.split()


def test_an_unknown_level_names_the_nearest(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = write_matrix_and_cases(tmp_path, MATRIX.replace("level: unit", "level: layr"), CASES)
    rc, _, err = cli(capsys, "list", "--matrix", str(path))
    assert rc == 2
    assert err.rstrip().endswith("unknown level 'layr' (allowed: unit, layer, module, "
                                 "workflow); did you mean 'layer'?"), err


def test_list_counts_the_cells_each_constraint_removed(
        capsys: pytest.CaptureFixture[str], matrix: Path) -> None:
    rc, out, err = cli(capsys, "list", "--matrix", str(matrix))
    assert rc == 0 and len(out.split()) == 6  # 8 combinations; fp64 with autocast=on: out
    assert err == ("6 of 6 cells selected; 2 combination(s) left out: 2 by constraint "
                   "autocast-needs-reduced-precision (--why-excluded lists them)\n")


@pytest.mark.parametrize(("yaml_text", "where", "words"), [
    ("version: 1\nplatforms:\n  cpu: {backend: gloo, device: cpu}\n targets: []\n", ":4:2:",
     "this line's indentation matches no block above it"),
    ("version: 1\nplatforms:\n\tcpu: {}\n", ":3:1:", "a tab: YAML indents with spaces only"),
    ("version: 1\ntargets: [a, b\nplatforms: {}\n", ":3:", "expected a ']' to close the '[' "
     "list"),
    ("version: 1\nname: 'open\n", ":3:", "a quote that is never closed"),
    ("version: 1\ntargets:\n  - x\n  y: 2\n", ":4:", "this key is not in line with the "
     "list above it"),
], ids=["indent", "tab", "bracket", "quote", "list-and-key"])
def test_yaml_syntax_errors_are_said_in_words(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], yaml_text: str, where: str,
        words: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(yaml_text)
    rc, _, err = cli(capsys, "list", "--matrix", str(path))
    assert rc == 2
    assert err.startswith(f"error: {path}{where}"), err
    assert f"YAML syntax error: {words}" in err, err


def test_a_missing_case_function_is_exit_2_before_any_world(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_matrix_and_cases(tmp_path, MATRIX.replace("cases:f", "cases:gg"), CASES)
    for command in ("list", "run"):
        out_dir = tmp_path / "out"
        extra = ["--dry-run", "--out", str(out_dir)] if command == "run" else []
        rc, _, err = cli(capsys, command, "--matrix", str(path), *extra)
        assert rc == 2, (command, err)
        assert err.startswith(f"error: {path}:6:11: targets[0].case: case 'cases:gg': "
                              f"{tmp_path / 'cases.py'} defines no 'gg'"), err
        assert "did you mean 'g'?" in err
        assert not (out_dir / "worlds").exists()


def test_a_case_module_that_does_not_parse_is_located(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_matrix_and_cases(tmp_path, MATRIX, "def f(cell):\n    return (\n")
    rc, _, err = cli(capsys, "list", "--matrix", str(path))
    assert rc == 2
    assert f"case module {tmp_path / 'cases.py'}:2: syntax error" in err, err


def test_durations_is_the_slowest_count_and_a_file_is_durations_from(
        tmp_path: Path) -> None:
    parsers = build_parser(cwd=tmp_path).parse_args(["config"]).parsers
    run = parsers["run"]
    args = run.parse_args(["--durations", "5", "--durations-from", "last/durations.json"])
    assert args.durations == 5
    assert args.durations_from == "last/durations.json"
    for command in ("run", "spill"):
        with pytest.raises(UsageError, match=r"--durations-from FILE"):
            parsers[command].parse_args(["--durations", "last/durations.json"])
    with pytest.raises(UsageError, match=r"is now --durations-from x.json"):
        parsers["show"].parse_args(["CELL", "--history", "--durations", "x.json"])
    assert "--durations-from" in run.format_help()


def test_a_top_level_flag_typo_names_the_nearest(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = cli(capsys, "--versoin")
    assert (rc, out) == (2, "")
    assert "unrecognized argument: --versoin (did you mean '--version'?)" in err


def test_a_tag_no_cell_carries_names_the_nearest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_matrix_and_cases(
        tmp_path, MATRIX.replace("    level: unit\n", "    level: unit\n    tags: [release]\n"),
        CASES)
    rc, _, err = cli(capsys, "list", "--matrix", str(path), "--tag", "relase")
    assert rc == 3
    assert "--tag 'relase' is on no cell (did you mean 'release'?)" in err


def test_an_unknown_exclude_key_names_the_nearest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_matrix_and_cases(
        tmp_path, MATRIX + "    params: {seq: [7, 64]}\nexclude:\n  - {seqq: 7}\n", CASES)
    rc, _, err = cli(capsys, "list", "--matrix", str(path))
    assert rc == 2
    assert "exclude[0].seqq: unknown key 'seqq'" in err and "did you mean 'seq'?" in err


def test_repro_of_an_undeclared_mutant_is_exit_2_naming_the_declared(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = ("from cpmatrix.parity import mutants\n\n"
             "@mutants(no_allreduce='the output is not all-reduced')\n"
             "def f(cell):\n    pass\n")
    path = write_matrix_and_cases(tmp_path, MATRIX, cases)
    cell = "allreduce_sum[unit,1x2,fp64,autocast=off"
    rc, out, err = cli(capsys, "repro", cell, "--matrix", str(path), "--mutant", "no_allreduc",
                       "--out", str(tmp_path / "out"))
    assert rc == 2, out + err
    assert "--mutant 'no_allreduc': cases:f declares no such mutant" in err
    assert "(declared: no_allreduce) (did you mean 'no_allreduce'?)" in err
    assert not (tmp_path / "out" / "worlds").exists()  # nothing ran
