"""Mutant declarations: what the runtime reads, and the typo guard of mutant_on."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cpmatrix.parity import declared_mutants, mutant_on, mutants
from cpmatrix.parity.mutants import ATTRIBUTE


@mutants(flip_sign="the backward flips a sign", skip_reduce="a grad misses its all-reduce")
def _case(cell: object) -> None:
    return None


def test_declaration_is_stored_on_the_function_unchanged() -> None:
    assert getattr(_case, ATTRIBUTE) == {
        "flip_sign": "the backward flips a sign",
        "skip_reduce": "a grad misses its all-reduce",
    }
    assert ATTRIBUTE == "__cpmatrix_mutants__"  # the name cpmatrix run reads
    assert _case(None) is None and _case.__name__ == "_case"
    copy = declared_mutants(_case)
    copy.clear()
    assert declared_mutants(_case)  # a copy: the declaration cannot be edited by accident
    assert declared_mutants(lambda cell: None) == {}


def test_stacked_declarations_merge_and_duplicates_are_refused() -> None:
    @mutants(b="second bug")
    @mutants(a="first bug")
    def case(cell: object) -> None: ...

    assert sorted(declared_mutants(case)) == ["a", "b"]
    with pytest.raises(ValueError, match="declared twice"):
        mutants(a="again")(case)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({}, "at least one"), ({"bad name": "x"}, "identifier"), ({"ok": " "}, "description")],
)
def test_bad_declarations_are_refused(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mutants(**kwargs)


def test_mutant_on_reads_the_cell_and_refuses_typos() -> None:
    assert mutant_on(SimpleNamespace(mutant="flip_sign"), "flip_sign")
    assert not mutant_on(SimpleNamespace(mutant=None), "flip_sign")
    assert not mutant_on(SimpleNamespace(mutant="skip_reduce"), "flip_sign")
    with pytest.raises(ValueError, match="not declared by any @mutants"):
        mutant_on(SimpleNamespace(mutant=None), "flip_sing")
