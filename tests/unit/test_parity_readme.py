"""The parity toolkit's reference (docs/parity.md) shows the code as it is: the table, the
worked example and every public name."""

from __future__ import annotations

import ast
import doctest
import importlib
from pathlib import Path

import pytest

from cpmatrix.parity import __all__ as public_names
from cpmatrix.parity import table_markdown

RES = Path(__file__).parents[1] / "resources" / "parity"
SECTION = (Path(__file__).parents[2] / "docs" / "parity.md").read_text()


def test_tolerance_table_is_the_one_in_the_code() -> None:
    assert table_markdown() in SECTION


def test_worked_example_is_the_file_the_worlds_run() -> None:
    # tests/resources/parity/{mutants,single}.yaml run this file on 1x1, 1x2 and 2x2
    example = (RES / "example_case.py").read_text()
    assert f"```python\n{example}```" in SECTION
    ast.parse(example)


def test_every_public_name_is_documented() -> None:
    missing = [name for name in public_names if name not in SECTION]
    assert not missing, missing


@pytest.mark.parametrize(
    "module",
    ["errors", "tolerance", "compare", "checks", "verdict", "features", "layout", "data", "dtypes",
     "mutants"],
)
def test_docstring_examples_run(module: str) -> None:
    mod = importlib.import_module(f"cpmatrix.parity.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
