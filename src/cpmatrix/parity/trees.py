"""A value as a tree of tensors: the leaves a check compares, by dotted names, and a
DTensor's global value.

Example::

    >>> [name for name, _ in flatten({"a": 1, "b": (2, 3)})]
    ['out.a', 'out.b.0', 'out.b.1']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["flatten", "to_full"]


def to_full(value: Any) -> Any:
    """A DTensor's global value (``full_tensor()``, which also reduces ``Partial``); else as is.

    ``to_local()`` would be only this rank's piece (or, for a ``Partial`` grad, only this
    rank's contribution), which is exactly the mistake a parity test must not make.
    """
    full_tensor = getattr(value, "full_tensor", None)
    if callable(full_tensor):
        return full_tensor()
    return value


def flatten(value: Any, prefix: str = "out") -> Iterator[tuple[str, Any]]:
    """Leaves of nested tuples/lists/dicts/dataclasses with dotted names: ``out``,
    ``out.0``, ``out.key``, ``out.field``.

    Example::

        >>> [name for name, _ in flatten({"a": 1, "b": (2, 3)})]
        ['out.a', 'out.b.0', 'out.b.1']
    """
    if isinstance(value, Mapping):
        for key in value:
            yield from flatten(value[key], f"{prefix}.{key}")
    elif isinstance(value, tuple | list):
        for i, item in enumerate(value):
            yield from flatten(item, f"{prefix}.{i}")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from flatten(getattr(value, f.name), f"{prefix}.{f.name}")
    else:
        yield prefix, value
