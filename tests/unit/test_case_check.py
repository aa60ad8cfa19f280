"""The case check before any world (cpmatrix.matrix.case_check): an absent case function
is exit 2 naming the matrix line and the module's file; a module that makes its names at
import (``globals()`` in a function it calls, a module ``__getattr__``, a star import) is
imported, that one module alone, rather than rejected."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpmatrix.errors import SpecError
from cpmatrix.matrix.case_check import check_cases
from cpmatrix.matrix.expand import expand
from cpmatrix.matrix.load import load_matrix
from matrix_files import HEAD

#: Module name -> its source, in ``cases/`` beside the matrix.
MODULES = {
    "plain": "def ok(cell):\n    return None\n",
    "filled": ("def _register():\n"
               "    for name in ('ring', 'ulysses'):\n"
               "        globals()[name] = lambda cell: None\n"
               "\n"
               "_register()\n"),
    "lazy": ("def __getattr__(name):\n"
             "    if name == 'ring':\n"
             "        return lambda cell: None\n"
             "    raise AttributeError(name)\n"),
    "star": "from plain import *\n",
    "attr": "import sys\nsetattr(sys.modules[__name__], 'ring', lambda cell: None)\n",
}


def _check(tmp_path: Path, case: str) -> None:
    (tmp_path / "cases").mkdir(exist_ok=True)
    for name, source in MODULES.items():
        (tmp_path / "cases" / f"{name}.py").write_text(source)
    path = tmp_path / "m.yaml"
    path.write_text(HEAD + "targets:\n  - name: t\n    level: unit\n"
                    f"    case: {case}\n    axes: {{mesh: [1x1], dtype: [fp64]}}\n")
    matrix = load_matrix(str(path))
    check_cases(matrix, expand(matrix).cells)


@pytest.mark.parametrize("case", ["filled:ring", "filled:ulysses", "lazy:ring", "star:ok",
                                  "attr:ring"])
def test_a_name_made_at_import_is_not_rejected(tmp_path: Path, case: str) -> None:
    _check(tmp_path, case)


def test_an_absent_name_names_the_matrix_line_and_the_module_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as err:
        _check(tmp_path, "plain:okk")
    text = str(err.value)
    assert text.startswith(f"{tmp_path / 'm.yaml'}:8:11: targets[0].case: ")
    assert f"{tmp_path / 'cases' / 'plain.py'} defines no 'okk' (did you mean 'ok'?)" in text


@pytest.mark.parametrize("case", ["filled:rnig", "lazy:nosuch", "star:nosuch"])
def test_an_absent_name_of_a_module_that_makes_names_is_found_by_import(
        tmp_path: Path, case: str) -> None:
    module, _, attr = case.partition(":")
    with pytest.raises(SpecError) as err:
        _check(tmp_path, case)
    text = str(err.value)
    assert text.startswith(f"{tmp_path / 'm.yaml'}:8:11: targets[0].case: ")
    assert (f"{tmp_path / 'cases' / f'{module}.py'} defines no {attr!r} (imported to look: "
            "it makes names at import)") in text
    if attr == "rnig":
        assert "did you mean 'ring'?" in text


def test_a_module_that_fails_to_import_is_left_to_the_world(tmp_path: Path) -> None:
    MODULES["broken"] = "globals()['ring'] = None\nraise RuntimeError('no GPU here')\n"
    try:
        _check(tmp_path, "broken:nosuch")  # the world shows the import error, user's frame
    finally:
        del MODULES["broken"]
