"""``[tool.cpmatrix]``: found upward, checked against the flags, the flags' defaults, and
``cpmatrix config`` says where each value came from (cpmatrix.cli.config)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpmatrix.cli import build_parser, main
from cpmatrix.cli.config import find_table

MATRIX = """\
version: 1
pythonpath: ["."]
platforms: {cpu: {backend: gloo, device: cpu}}
targets:
  - {name: t, case: "cases:f", level: unit, axes: {mesh: [1x1, 1x2], dtype: [fp64]}}
"""


def project(root: Path, table: str, *, matrix: str = "tests/cp/m.yaml") -> Path:
    """A project: a matrix and its case module under ``tests/cp``, and the table."""
    folder = root / Path(matrix).parent
    folder.mkdir(parents=True, exist_ok=True)
    (root / matrix).write_text(MATRIX)
    (folder / "cases.py").write_text("def f(cell):\n    pass\n")
    (root / "pyproject.toml").write_text(f'[project]\nname = "x"\n\n[tool.cpmatrix]\n{table}')
    return root


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], cwd: Path,
             *argv: str) -> tuple[int, str, str]:
    monkeypatch.chdir(cwd)
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_found_from_a_subfolder_and_paths_are_relative_to_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    project(tmp_path, 'matrix = "tests/cp/m.yaml"\n')
    deep = tmp_path / "src" / "pkg"
    deep.mkdir(parents=True)
    rc, out, err = run_main(monkeypatch, capsys, deep, "list")
    assert rc == 0, err
    assert out.split() == ["t[unit,1x1,fp64,autocast=off,reference]@cpu",
                           "t[unit,1x2,fp64,autocast=off,reference]@cpu"]


def test_a_pyproject_without_the_table_is_passed_over(tmp_path: Path) -> None:
    project(tmp_path, 'matrix = "tests/cp/m.yaml"\n')
    inner = tmp_path / "sub"
    inner.mkdir()
    (inner / "pyproject.toml").write_text('[project]\nname = "inner"\n')
    found = find_table(inner)
    assert found is not None and found.path == tmp_path / "pyproject.toml"


def test_a_flag_overrides_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    project(tmp_path, 'matrix = "tests/cp/m.yaml"\nplatform = "gpu"\n')
    # the table's platform is unknown to the matrix: used when no flag is given ...
    rc, _, err = run_main(monkeypatch, capsys, tmp_path, "list")
    assert rc == 2 and "--platform 'gpu': unknown" in err
    # ... and overridden by the flag
    rc, out, _ = run_main(monkeypatch, capsys, tmp_path, "list", "--platform", "cpu")
    assert rc == 0 and len(out.split()) == 2


def test_run_options_come_from_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project(tmp_path, 'out = "build/cp"\nrunner = "sandbox"\njobs = 3\nno-cache = true\n'
            'matrix = "tests/cp/m.yaml"\n')
    args = build_parser(tmp_path).parse_args(["run"])
    assert (args.out, args.runner, args.jobs, args.no_cache) == (
        str(tmp_path / "build" / "cp"), "sandbox", 3, True)
    assert args.matrix == str(tmp_path / "tests" / "cp" / "m.yaml")
    # the places other commands derive from ``out``
    parser = build_parser(tmp_path)
    assert parser.parse_args(["repro", "x"]).out == str(tmp_path / "build" / "cp" / "repro")
    assert parser.parse_args(["repro", "x"]).from_dir == str(tmp_path / "build" / "cp")
    assert parser.parse_args(["gate", "--policy", "p"]).report == (
        tmp_path / "build" / "cp" / "report.xml")
    assert parser.parse_args(["show", "x"]).out == str(tmp_path / "build" / "cp")
    # a flag still wins
    assert parser.parse_args(["run", "--jobs", "1"]).jobs == 1


@pytest.mark.parametrize(("table", "line", "message"), [
    ('matrix = "m.yaml"\nplatfrom = "cpu"\n', 6,
     "tool.cpmatrix.platfrom: unknown key 'platfrom' (allowed: "),
    ('jobs = "two"\n', 5, "tool.cpmatrix.jobs: expected an integer, got 'two'"),
    ('runner = 3\n', 5, "tool.cpmatrix.runner: expected a string, got 3"),
    ('launcher = "forks"\n', 5, "tool.cpmatrix.launcher: 'forks' is not allowed (allowed: "
     "fork, torchrun); did you mean 'fork'?"),
    ('no-cache = "yes"\n', 5, "tool.cpmatrix.no-cache: expected true or false, got 'yes'"),
    ('matrix = 3\n', 5, "tool.cpmatrix.matrix: expected a path (a string), got 3"),
    ('remote_cache = ""\n', 5, "did you mean 'remote-cache'?"),
], ids=["unknown-key", "int", "str", "choice", "bool", "path", "underscore"])
def test_a_bad_table_is_exit_2_naming_file_line_key_and_allowed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        table: str, line: int, message: str) -> None:
    project(tmp_path, table)
    rc, out, err = run_main(monkeypatch, capsys, tmp_path, "list")
    assert (rc, out) == (2, "")
    assert err.startswith(f"error: {tmp_path / 'pyproject.toml'}:{line}:1: "), err
    assert message in err, err
    assert "Traceback" not in err


def test_a_pyproject_that_is_not_toml_is_exit_2_with_its_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.cpmatrix]\nmatrix = "unclosed\n')
    rc, _, err = run_main(monkeypatch, capsys, tmp_path, "list")
    assert rc == 2
    assert err.startswith(f"error: {tmp_path / 'pyproject.toml'}:2:") and "TOML" in err, err


def test_config_prints_each_value_and_where_it_came_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    project(tmp_path, 'matrix = "tests/cp/m.yaml"\njobs = 2\n')
    rc, out, _ = run_main(monkeypatch, capsys, tmp_path, "config")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == f"config: {tmp_path / 'pyproject.toml'} [tool.cpmatrix]"
    matrix = next(ln for ln in lines if ln.split()[0] == "matrix")
    assert str(tmp_path / "tests" / "cp" / "m.yaml") in matrix
    assert matrix.endswith(f"({tmp_path / 'pyproject.toml'}:5)")
    jobs = next(ln for ln in lines if ln.split()[0] == "jobs")
    assert jobs.split()[2] == "2" and jobs.endswith(":6)")
    runner = next(ln for ln in lines if ln.split()[0] == "runner")
    assert runner.split()[2] == "local" and runner.endswith("(default)")


def test_without_a_table_config_says_defaults_apply(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_main(monkeypatch, capsys, tmp_path, "config")
    assert rc == 0 and out.startswith("no [tool.cpmatrix] in a pyproject.toml from ")


def test_init_refuses_to_overwrite_and_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tests" / "cp").mkdir(parents=True)
    (tmp_path / "tests" / "cp" / "gates.yaml").write_text("mine\n")
    rc, _, err = run_main(monkeypatch, capsys, tmp_path, "init")
    assert rc == 2 and "tests/cp/gates.yaml (exists)" in err and "never overwrites" in err
    assert not (tmp_path / "tests" / "cp" / "cases.py").exists()
    assert not (tmp_path / "pyproject.toml").exists()
    assert (tmp_path / "tests" / "cp" / "gates.yaml").read_text() == "mine\n"


def test_init_checks_every_place_before_writing_any(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "cp").write_text("a file where the starter folder goes\n")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mine"\n')
    rc, _, err = run_main(monkeypatch, capsys, tmp_path, "init")
    assert rc == 2, err
    assert "nothing was written" in err
    assert "tests/cp (a file, where a folder is needed)" in err
    assert (tmp_path / "pyproject.toml").read_text() == '[project]\nname = "mine"\n'
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "gates.yaml").write_text("mine\n")
    rc, _, err = run_main(monkeypatch, capsys, tmp_path, "init", "--dir", "other")
    assert rc == 2 and "other/gates.yaml (exists)" in err, err
    assert not (tmp_path / "other" / "cases.py").exists()
    assert "cpmatrix" not in (tmp_path / "pyproject.toml").read_text()


def test_init_in_a_subfolder_of_a_project_says_so_and_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_main(monkeypatch, capsys, tmp_path, "init")
    assert rc == 0, err
    sub = tmp_path / "pkg" / "deep"
    sub.mkdir(parents=True)
    rc, _, err = run_main(monkeypatch, capsys, sub, "init")
    assert rc == 2
    assert (f"inside a project that already has [tool.cpmatrix] "
            f"({tmp_path / 'pyproject.toml'})") in err
    assert "nothing was written" in err and list(sub.iterdir()) == []
    (sub / "pyproject.toml").write_text('[project]\nname = "inner"\n')  # no table of its own
    rc, _, err = run_main(monkeypatch, capsys, sub, "init")
    assert rc == 2 and "already has [tool.cpmatrix]" in err
    assert (sub / "pyproject.toml").read_text() == '[project]\nname = "inner"\n'


def test_init_appends_the_table_to_an_existing_pyproject(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mine"\n')
    rc, out, err = run_main(monkeypatch, capsys, tmp_path, "init")
    assert rc == 0, err
    text = (tmp_path / "pyproject.toml").read_text()
    assert text.startswith('[project]\nname = "mine"\n\n[tool.cpmatrix]\n')
    rc, out, _ = run_main(monkeypatch, capsys, tmp_path, "list")
    assert rc == 0 and len(out.split()) == 5
    rc, _, err = run_main(monkeypatch, capsys, tmp_path, "init")
    assert rc == 2 and "pyproject.toml [tool.cpmatrix]" in err
