"""Failures raised by the parity toolkit, each naming the check that failed.

Every failure is a :class:`ParityError`, an ``AssertionError``, so a case fails the
ordinary way. ``.check`` names the first check that failed and ``.failed`` every one,
which is what the runtime prints for a killed mutant.

Example::

    >>> err = MismatchError("param_grad", "param_grad: 'weight' max abs 0.5 > atol")
    >>> isinstance(err, AssertionError), err.check, err.failed
    (True, 'param_grad', ('param_grad',))
    >>> check_of(err), check_of(ValueError("x"))
    ('param_grad', 'error:ValueError')
    >>> Check.PARAM_GRAD == "param_grad", ParityError(Check.SETUP, "x").check
    (True, 'setup')
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum

__all__ = [
    "CHECKS",
    "Check",
    "DtypePathError",
    "EntropyError",
    "MismatchError",
    "ParityError",
    "ReplicationError",
    "ToleranceError",
    "VacuousError",
    "check_of",
]

class Check(StrEnum):
    """The names ``ParityError.check`` takes, in the order :func:`~cpmatrix.parity.check_parity`
    runs them. The runtime shows them when it says which check killed a mutant.

    A member equals its name's string (``Check.LOSS == "loss"``): the frozen modules
    (``checks.py``, ``compare.py``, ``verdict.py``, ``tolerance.py``) spell them as literals.
    """

    TOLERANCE = "tolerance"  # a loosened tolerance without a written reason
    SETUP = "setup"  # inputs/placements/state_dict do not fit together
    #: A value that must be the same on every rank is not.
    REPLICATED_IDENTICAL = "replicated_identical"
    SHARDING_ACTIVE = "sharding_active"  # nothing is really sharded on a mesh with an axis > 1
    NONZERO = "nonzero"  # output or gradients all zero / not finite: the comparison is vacuous
    OUTPUT = "output"  # CP output vs serial output
    INPUT_GRAD = "input_grad"  # every input's grad vs serial
    PARAM_GRAD = "param_grad"  # every parameter's grad, by name, vs serial
    BUFFER = "buffer"  # every buffer (running stats, RoPE tables), by name, vs serial
    LOSS = "loss"  # workflow: per-step loss vs serial
    WEIGHT_DELTA = "weight_delta"  # workflow: parameter change after N optimizer steps
    RNG_ENTROPY = "rng_entropy"  # property: sharded draws disjoint, replicated draws identical
    DTYPE_PATH = "dtype_path"  # property: the dtypes a Function/module really computes in


#: Every :class:`Check`'s name, in its order: the strings that results, reports and the
#: gate store (a ``Check`` member equals its string).
CHECKS: tuple[str, ...] = tuple(c.value for c in Check)


class ParityError(AssertionError):
    """A check of the toolkit failed. ``check`` is the first failing check's name."""

    def __init__(self, check: str, message: str, *, failed: Sequence[str] | None = None) -> None:
        super().__init__(message)
        # Plain strings (a Check member's value): what a result and a report carry.
        self.check = str(check)
        self.failed: tuple[str, ...] = tuple(map(str, failed)) if failed else (self.check,)


class ToleranceError(ParityError):
    """A tolerance looser than the table's row without a written reason."""

    def __init__(self, message: str) -> None:
        super().__init__(Check.TOLERANCE, message)


class MismatchError(ParityError):
    """CP values differ from the serial reference beyond the tolerance."""


class ReplicationError(ParityError):
    """A value that must be identical on every rank differs across ranks."""


class VacuousError(ParityError):
    """The comparison could pass on a broken implementation (zero grads, nothing sharded)."""


class EntropyError(ParityError):
    """An RNG entropy property is violated or was not exercised."""

    def __init__(self, message: str) -> None:
        super().__init__(Check.RNG_ENTROPY, message)


class DtypePathError(ParityError):
    """A Function or module computed in a dtype other than the expected one."""

    def __init__(self, message: str) -> None:
        super().__init__(Check.DTYPE_PATH, message)


def check_of(exc: BaseException) -> str:
    """The check that an exception stands for: ``exc.check``, else ``error:<Type>``."""
    if isinstance(exc, ParityError):
        return exc.check
    return f"error:{type(exc).__name__}"


@contextmanager
def odd_input_fails(check: str) -> Iterator[None]:
    """Inside, an exception other than a :class:`ParityError` becomes a ``ParityError``
    of ``check`` that names it (chained): a value no check can judge (a placement that is
    not one, a mapping that is not one, a tensor type a verdict cannot read) fails that
    check with its reason, never as an internal error of the toolkit.

    Only the toolkit's own judging runs inside, never the code under test: an exception of
    a case's model is that model's error, and stays one.

    >>> with odd_input_fails("nonzero"):
    ...     {}["grad w"]
    Traceback (most recent call last):
    ...
    cpmatrix.parity.errors.ParityError: nonzero: cannot judge the values given: KeyError: 'grad w'
    """
    try:
        yield
    except ParityError:
        raise
    except Exception as exc:
        raise ParityError(
            check, f"{check}: cannot judge the values given: {type(exc).__name__}: {exc}"
        ) from exc
