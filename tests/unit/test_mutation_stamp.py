"""The mutation gate's stamp: CI skips a module only when nothing its score depends on moved.

``tools/mutation_score.py --changed-only`` trusts a recorded score for a module only while
the hash of the module's source, the test files of its group
(``[[tool.mutation_score.group]]``), the ``[tool.mutmut]`` settings and the tool itself is
the one recorded with it; another group's tests do not move it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from script_modules import load_script

ROOT = Path(__file__).resolve().parents[2]


tool = load_script("tools/mutation_score.py", "mutation_score")
MODULE = "src/cpmatrix/parity/tolerance.py"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of what the hash reads: pyproject, the tool, the tests and one module."""
    root = tmp_path / "p"
    (root / "tools").mkdir(parents=True)
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    shutil.copy2(ROOT / "tools" / "mutation_score.py", root / "tools" / "mutation_score.py")
    shutil.copytree(ROOT / "tests", root / "tests",
                    ignore=shutil.ignore_patterns("__pycache__", "resources"))
    (root / MODULE).parent.mkdir(parents=True)
    shutil.copy2(ROOT / MODULE, root / MODULE)
    (root / "src" / "cpmatrix" / "other.py").write_text("x = 1\n")
    _append(root / "pyproject.toml", '\n[[tool.mutation_score.group]]\n'
            'modules = ["src/cpmatrix/other.py"]\ntests = ["tests/unit/test_repeated.py"]\n')
    return root


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


@pytest.mark.parametrize("edit", [
    MODULE,                                    # the module itself
    "tests/unit/test_parity_tolerance.py",     # a test of the selection
    "tests/conftest.py",                       # a helper every test imports
    "tools/mutation_score.py",                 # the tool that scores
])
def test_the_hash_moves_with_every_input(project: Path, edit: str) -> None:
    before = tool.input_hash(project, MODULE)
    _append(project / edit, "\n# edited\n")
    assert tool.input_hash(project, MODULE) != before


def test_the_hash_moves_with_the_mutmut_settings(project: Path) -> None:
    before = tool.input_hash(project, MODULE)
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(
        '"-m", "not slow and not docker"]', '"-m", "not slow"]'))
    assert tool.input_hash(project, MODULE) != before


def test_the_hash_ignores_what_the_score_does_not_depend_on(project: Path) -> None:
    before = tool.input_hash(project, MODULE)
    gate = "src/cpmatrix/gate/_checks.py"
    (project / gate).parent.mkdir(parents=True)
    shutil.copy2(ROOT / gate, project / gate)
    gate_before = tool.input_hash(project, gate)
    _append(project / "tests" / "unit" / "test_gate.py", "\n# edited\n")  # another group's
    assert tool.input_hash(project, gate) != gate_before, "the gate's own test moved"
    pyproject = project / "pyproject.toml"  # a module added to the mutated list
    pyproject.write_text(pyproject.read_text().replace(
        '"src/cpmatrix/repeated.py",\n]', '"src/cpmatrix/repeated.py",\n    "src/x.py",\n]'))
    _append(pyproject, '\n[[tool.mutation_score.group]]\nmodules = ["src/x.py"]\n'
            'tests = ["tests/unit/test_gate.py"]\n')
    _append(project / "src" / "cpmatrix" / "other.py", "y = 2\n")
    (project / "README.md").write_text("docs\n")
    (project / "tests" / "unused_helper.py").write_text("x = 1\n")  # no judging test imports it
    assert tool.input_hash(project, MODULE) == before


def test_a_helper_counts_when_a_judging_test_imports_it_even_through_another(
        project: Path) -> None:
    (project / "tests" / "deep_helper.py").write_text("x = 1\n")
    (project / "tests" / "mid_helper.py").write_text("from deep_helper import x\n")
    before = tool.input_hash(project, MODULE)
    _append(project / "tests" / "deep_helper.py", "y = 2\n")
    assert tool.input_hash(project, MODULE) == before, "nothing imports mid_helper yet"
    _append(project / "tests" / "unit" / "test_parity_tolerance.py", "\nimport mid_helper\n")
    with_import = tool.input_hash(project, MODULE)
    _append(project / "tests" / "deep_helper.py", "z = 3\n")
    assert tool.input_hash(project, MODULE) != with_import


def test_a_stamp_vouches_only_for_the_same_inputs_and_a_passing_score() -> None:
    stamp = {MODULE: {"hash": "h1", "score": 97.5, "date": "2026-12-01"}}
    assert tool.unchanged(stamp, MODULE, "h1", 90.0) == stamp[MODULE]
    assert tool.unchanged(stamp, MODULE, "h2", 90.0) is None          # inputs moved
    assert tool.unchanged(stamp, MODULE, "h1", 98.0) is None          # score too low
    assert tool.unchanged(stamp, "src/cpmatrix/gate/_checks.py", "h1", 90.0) is None
    assert tool.unchanged({MODULE: {"hash": "h1"}}, MODULE, "h1", 90.0) is None


class _Calls:
    def __init__(self) -> None:
        self.mutated: list[str] = []


@pytest.fixture
def fake_mutmut(monkeypatch: pytest.MonkeyPatch, project: Path) -> _Calls:
    """mutmut itself replaced: which modules would it mutate, with a made-up score."""
    calls = _Calls()
    monkeypatch.setattr(tool, "ROOT", project)
    monkeypatch.setattr(tool, "modules_of", lambda _p: [MODULE, "src/cpmatrix/other.py"])

    def prepare(_workdir: Path, modules: list[str], _tests: list[str]) -> None:
        calls.mutated.extend(modules)

    def scores(_workdir: Path, modules: list[str]) -> tuple[list[Any], dict[str, Any]]:
        return [tool.Score(module=m, mutants=10, killed=10, timeout=0, survived=0,
                           not_reached=0, other=0) for m in modules], {}

    monkeypatch.setattr(tool, "prepare", prepare)
    monkeypatch.setattr(tool, "run_mutmut", lambda _w, _j: 0.0)
    monkeypatch.setattr(tool, "scores", scores)
    return calls


def test_changed_only_mutates_just_the_changed_module(fake_mutmut: _Calls, project: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    stamp = project / "stamp.json"
    assert tool.main(["--record", "--stamp", str(stamp)]) == 0
    assert fake_mutmut.mutated == [MODULE, "src/cpmatrix/other.py"]
    recorded = json.loads(stamp.read_text())["modules"]
    assert recorded[MODULE]["score"] == 100.0

    fake_mutmut.mutated.clear()
    assert tool.main(["--changed-only", "--fail-under", "90", "--stamp", str(stamp)]) == 0
    assert fake_mutmut.mutated == [], "nothing changed: nothing is mutated"
    said = capsys.readouterr().out
    assert f"{MODULE}: unchanged since" in said and "100.0%" in said

    _append(project / "src" / "cpmatrix" / "other.py", "y = 2\n")
    assert tool.main(["--changed-only", "--fail-under", "90", "--stamp", str(stamp)]) == 0
    assert fake_mutmut.mutated == ["src/cpmatrix/other.py"]
    assert "other.py: mutating (its source, tests or settings changed)" in \
        capsys.readouterr().out


def test_changed_only_without_a_stamp_mutates_everything(fake_mutmut: _Calls,
                                                         project: Path) -> None:
    assert tool.main(["--changed-only", "--stamp", str(project / "none.json")]) == 0
    assert fake_mutmut.mutated == [MODULE, "src/cpmatrix/other.py"]


def test_the_repository_stamp_is_readable() -> None:
    """The committed stamp parses, and names only modules mutmut is configured for."""
    stamp = tool.read_stamp(tool.STAMP)
    configured = set(tool.modules_of(ROOT / "pyproject.toml"))
    assert set(stamp) <= configured


def test_a_module_no_group_judges_is_a_config_error(
        project: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(
        '"src/cpmatrix/repeated.py",\n]', '"src/cpmatrix/repeated.py",\n    "src/x.py",\n]'))
    monkeypatch.setattr(tool, "ROOT", project)
    assert tool.main(["--changed-only", "--stamp", str(project / "none.json")]) == 2
    err = capsys.readouterr().err
    assert "no [[tool.mutation_score.group]] names the tests that judge src/x.py" in err


def test_a_missing_test_file_of_a_group_is_a_config_error(project: Path) -> None:
    (project / "tests" / "unit" / "test_repeated.py").unlink()
    with pytest.raises(tool.ConfigError, match=r"no such test file tests/unit/test_repeated\.py"):
        tool.groups_of(project)


def test_each_group_runs_against_exactly_its_tests(project: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The workdir's mutmut settings: only the group's modules, only its tests (with the
    selection's options kept)."""
    for name in ("README.md",):
        (project / name).write_text("x\n")
    for name in ("matrix", "docs"):
        (project / name).mkdir()
    monkeypatch.setattr(tool, "ROOT", project)
    tool.prepare(project / "w", ["src/cpmatrix/other.py"], ["tests/unit/test_repeated.py"])
    import tomllib

    mutmut = tomllib.loads((project / "w" / "pyproject.toml").read_text())["tool"]["mutmut"]
    assert mutmut["only_mutate"] == ["src/cpmatrix/other.py"]
    assert mutmut["pytest_add_cli_args_test_selection"] == [
        "tests/unit/test_repeated.py", "-m", "not slow and not docker"]
