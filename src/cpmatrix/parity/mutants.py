"""Negative controls: a case declares named planted bugs; the toolkit must kill each one.

A test that passes on a broken implementation is worse than none, and the only proof that
it would not is to break the implementation on purpose and watch the test fail. A case
declares its mutants with :func:`mutants`; ``cpmatrix run --mutants`` runs each cell once
per mutant with ``cell.mutant`` set and expects a failure. The failing check
(:func:`cpmatrix.parity.check_of` on the exception) says which check killed it.

Example::

    >>> @mutants(no_allreduce="the replicated weight grad misses its all-reduce",
    ...          fp32_roundtrip="the fp64 path computes in fp32")
    ... def cp_linear_case(cell):
    ...     ...
    >>> sorted(declared_mutants(cp_linear_case))
    ['fp32_roundtrip', 'no_allreduce']

and in the CP code under test (or the case)::

    if mutant_on(cell, "no_allreduce"):
        pass                                    # the planted bug
    else:
        dist.all_reduce(grad_w, group=group)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

__all__ = ["ATTRIBUTE", "declared_mutants", "mutant_on", "mutants"]

#: Where the declaration is stored on the case function (the runtime reads it).
ATTRIBUTE: Final = "__cpmatrix_mutants__"

F = TypeVar("F", bound=Callable[..., Any])

#: Every mutant name declared by any imported case: catches a typo in ``mutant_on``,
#: which would otherwise leave the bug switched off and the mutant "surviving" for no reason.
_DECLARED: set[str] = set()


def mutants(**declared: str) -> Callable[[F], F]:
    """Declare a case's mutants: ``name="what the planted bug does"``.

    Stores ``fn.__cpmatrix_mutants__`` (name -> description) and returns ``fn`` unchanged,
    so the case stays a plain function.
    """
    if not declared:
        raise ValueError("@mutants() needs at least one name='description'")
    for name, description in declared.items():
        if not name.isidentifier():
            raise ValueError(f"mutant name {name!r} must be an identifier")
        if not isinstance(description, str) or not description.strip():
            raise ValueError(f"mutant {name!r} needs a description of the planted bug")

    def decorate(fn: F) -> F:
        existing = dict(getattr(fn, ATTRIBUTE, {}))
        clash = sorted(set(existing) & set(declared))
        if clash:
            raise ValueError(f"{fn.__qualname__}: mutants {clash} declared twice")
        existing.update(declared)
        setattr(fn, ATTRIBUTE, existing)
        _DECLARED.update(declared)
        return fn

    return decorate


def declared_mutants(case: Callable[..., Any]) -> dict[str, str]:
    """A case's mutants (a copy): name -> description; empty if it declares none."""
    return dict(getattr(case, ATTRIBUTE, {}))


def mutant_on(cell: Any, name: str) -> bool:
    """True when ``name`` is the mutant switched on for this run (``cell.mutant``).

    Raises ``ValueError`` for a name no imported case declared (a typo would keep the bug
    off and make its mutant survive).
    """
    if name not in _DECLARED:
        raise ValueError(
            f"mutant {name!r} is not declared by any @mutants(...) case "
            f"(declared: {sorted(_DECLARED)})"
        )
    return getattr(cell, "mutant", None) == name
