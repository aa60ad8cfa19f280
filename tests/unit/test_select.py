"""``-k`` expressions, ``--tag`` and ``--platform`` selection (the CLI side: test_cli_list)."""

from __future__ import annotations

import re

import pytest

from cpmatrix.errors import UsageError
from cpmatrix.matrix.expand import expand
from cpmatrix.matrix.load import parse_matrix
from cpmatrix.matrix.select import parse_keyword_expr, select_cells

ID = "ring_attention[unit,2x2,bf16,autocast=on,kernel,seq=7]@cpu"
WORDS = [ID, "attention", "Fast"]


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("ring", True),
        ("RING", True),  # case-insensitive
        ("2x2", True),
        ("3x3", False),
        ("seq=7", True),  # axis values are substrings of the id
        ("autocast=on", True),
        ("unit,2x2", True),
        ("@cpu", True),
        ("@cuda", False),
        ("fast", True),  # tag, any case
        ("fas", False),  # tags match whole, not as substrings
        ("attention", True),
        ("ring and 2x2", True),
        ("ring and 3x3", False),
        ("3x3 or bf16", True),
        ("3x3 or fp32", False),
        ("not 3x3", True),
        ("not ring", False),
        ("not not ring", True),
        ("ring and not kernel", False),
        ("(3x3 or 2x2) and (fp32 or bf16)", True),
        ("3x3 or 2x2 and fp32", False),  # and binds tighter than or
        ("2x2 or 3x3 and fp32", True),
        ("(2x2 or 3x3) and fp32", False),
        ("not (ring or x)", False),
        ("not 3x3 and not fp32", True),
        ("((ring))", True),
        ("  ring   and(2x2)", True),
        (" and ".join(["ring"] * 2000), True),  # long chains do not recurse
        (" or ".join(["nope"] * 2000), False),
    ],
)
def test_keyword_expression(expr: str, expected: bool) -> None:
    assert parse_keyword_expr(expr).matches(WORDS) is expected


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("", "-k: empty expression"),
        ("   ", "-k: empty expression"),
        ("ring and", "-k 'ring and': expected a word or '(' at column 9"),
        ("and ring", "-k 'and ring': unexpected 'and' at column 1"),
        ("(ring", "-k '(ring': expected ')' at column 6"),
        ("ring)", "-k 'ring)': unexpected ')' at column 5"),
        ("ring 2x2", "-k 'ring 2x2': unexpected '2x2' at column 6"),
        ("not", "-k 'not': expected a word or '(' at column 4"),
        ("()", "-k '()': unexpected ')' at column 2"),
        ("ring or or x", "-k 'ring or or x': unexpected 'or' at column 9"),
        ("not " * 101 + "x", "nested more than 100 levels deep"),
        ("(" * 101 + "x" + ")" * 101, "nested more than 100 levels deep"),
    ],
)
def test_bad_keyword_expression(expr: str, message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        parse_keyword_expr(expr)


def test_nesting_up_to_the_limit_is_fine() -> None:
    assert parse_keyword_expr("not " * 100 + "y").matches(["y"]) is True  # an even count
    assert parse_keyword_expr("not " * 99 + "y").matches(["y"]) is False
    assert parse_keyword_expr("(" * 100 + "y" + ")" * 100).matches(["y"]) is True


MATRIX = parse_matrix("""\
version: 1
platforms:
  cpu: {backend: gloo, device: cpu}
  cuda: {backend: nccl, device: cuda}
targets:
  - {name: ring, case: "a:ring", level: unit, tags: [attention, fast], axes: {mesh: [1x1, 2x2]}}
  - {name: gather, case: "a:gather", level: layer, tags: [collective, fast], platforms: [cpu]}
""")
CELLS = expand(MATRIX, lambda module: module.encode()).cells


@pytest.mark.parametrize(
    ("platform", "keyword", "tags", "expected"),
    [
        (None, None, (), ["ring[unit,1x1,fp64,autocast=off,reference]@cpu",
                          "ring[unit,2x2,fp64,autocast=off,reference]@cpu",
                          "ring[unit,1x1,fp64,autocast=off,reference]@cuda",
                          "ring[unit,2x2,fp64,autocast=off,reference]@cuda",
                          "gather[layer,1x1,fp64,autocast=off,reference]@cpu"]),
        ("cuda", None, (), ["ring[unit,1x1,fp64,autocast=off,reference]@cuda",
                            "ring[unit,2x2,fp64,autocast=off,reference]@cuda"]),
        ("cpu", "1x1", (), ["ring[unit,1x1,fp64,autocast=off,reference]@cpu",
                            "gather[layer,1x1,fp64,autocast=off,reference]@cpu"]),
        (None, "collective or 2x2 and cuda", (),
         ["ring[unit,2x2,fp64,autocast=off,reference]@cuda",
          "gather[layer,1x1,fp64,autocast=off,reference]@cpu"]),
        (None, None, ("fast", "collective"), ["gather[layer,1x1,fp64,autocast=off,reference]@cpu"]),
        ("cuda", None, ("collective",), []),
        (None, "not fast", (), []),
    ],
)
def test_select_cells(
    platform: str | None, keyword: str | None, tags: tuple[str, ...], expected: list[str]
) -> None:
    chosen = select_cells(CELLS, platform=platform, keyword=keyword, tags=tags)
    assert [c.id for c in chosen] == expected
