"""Cell ids: ``target[level,mesh,dtype,autocast=on|off,path,k=v,...]@platform``.

An id is stable, human-readable, unique within a matrix, safe as a file name (only
letters, digits and ``_ . + - [ ] , = @``) and parses back into its parts.

Example::

    >>> cid = format_cell_id("ring_attention", "unit", "2x2", "bf16", True, "kernel",
    ...                      (("seq", 7),), "cpu")
    >>> cid
    'ring_attention[unit,2x2,bf16,autocast=on,kernel,seq=7]@cpu'
    >>> parse_cell_id(cid).params
    (('seq', '7'),)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from cpmatrix.matrix.schema import DTYPES, LEVELS, NAME_RE, PATHS, VALUE_RE, Mesh, Scalar

__all__ = ["CellKey", "format_cell_id", "parse_cell_id", "render_value"]

_ID_RE: Final = re.compile(
    r"^(?P<target>[A-Za-z_][A-Za-z0-9_]*)\[(?P<body>[^\[\]@]*)\]@(?P<platform>[A-Za-z_][A-Za-z0-9_]*)\Z"
)


def render_value(value: Scalar) -> str:
    """A parameter value as it appears in an id."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def format_cell_id(
    target: str,
    level: str,
    mesh: str,
    dtype: str,
    autocast: bool,
    path: str,
    params: tuple[tuple[str, Scalar], ...],
    platform: str,
) -> str:
    parts = [level, mesh, dtype, f"autocast={'on' if autocast else 'off'}", path]
    parts += [f"{k}={render_value(v)}" for k, v in params]
    return f"{target}[{','.join(parts)}]@{platform}"


@dataclass(frozen=True, slots=True)
class CellKey:
    """The parts of a parsed id; parameter values stay as the text in the id."""

    target: str
    level: str
    mesh: str
    dtype: str
    autocast: bool
    path: str
    params: tuple[tuple[str, str], ...]
    platform: str


def parse_cell_id(cell_id: str) -> CellKey:
    """Split an id into its parts; ``ValueError`` with the expected shape otherwise."""
    m = _ID_RE.match(cell_id)
    expected = "expected target[level,mesh,dtype,autocast=on|off,path,k=v...]@platform"
    if m is None:
        raise ValueError(f"malformed cell id {cell_id!r}: {expected}")
    parts = m.group("body").split(",")
    if len(parts) < 5 or not parts[3].startswith("autocast="):
        raise ValueError(f"malformed cell id {cell_id!r}: {expected}")
    level, mesh, dtype, autocast, path = parts[:5]
    if autocast not in ("autocast=on", "autocast=off"):
        raise ValueError(f"malformed cell id {cell_id!r}: autocast must be on or off")
    for axis, value, allowed in (("level", level, LEVELS), ("dtype", dtype, DTYPES),
                                 ("path", path, PATHS)):
        if value not in allowed:
            raise ValueError(
                f"malformed cell id {cell_id!r}: unknown {axis} {value!r} "
                f"(allowed: {', '.join(allowed)})"
            )
    try:
        Mesh.parse(mesh)
    except ValueError:
        raise ValueError(
            f"malformed cell id {cell_id!r}: mesh {mesh!r} is not RxC (e.g. 2x2)"
        ) from None
    params = []
    for part in parts[5:]:
        key, sep, value = part.partition("=")
        if not sep or not NAME_RE.match(key) or not VALUE_RE.match(value):
            raise ValueError(f"malformed cell id {cell_id!r}: parameter {part!r} is not k=v")
        params.append((key, value))
    return CellKey(
        target=m.group("target"),
        level=level,
        mesh=mesh,
        dtype=dtype,
        autocast=autocast == "autocast=on",
        path=path,
        params=tuple(params),
        platform=m.group("platform"),
    )
