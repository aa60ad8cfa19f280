"""The standard axes' values (level, mesh, dtype, autocast, path) and an extra axis's
value's text: read and checked once.

Example::

    >>> reader, node = compose("[1x2, 2x2]", "m.yaml")
    >>> axis_list(reader, "mesh", node, "defaults.mesh")
    ('1x2', '2x2')
    >>> reader, node = compose("[float32, bfloat16]", "m.yaml")  # torch's spellings
    >>> axis_list(reader, "dtype", node, "defaults.dtype")
    ('fp32', 'bf16')
"""

from __future__ import annotations

import yaml

from cpmatrix.matrix.schema import AUTOCAST, DTYPES, LEVELS, PATHS, VALUE_RE, Mesh, Scalar
from cpmatrix.matrix.yamlreader import SpecReader, render
from cpmatrix.suggest import DTYPE_ALIASES, suggestion

__all__ = ["axis_list", "axis_value", "where_of"]


def axis_value(ctx: SpecReader, axis: str, value: Scalar, node: yaml.Node, path: str) -> str:
    """Validate one standard-axis value and return its canonical text."""
    if axis == "autocast":
        # YAML 1.1 reads bare on/off as booleans; accept both spellings.
        text = ("on" if value else "off") if isinstance(value, bool) else str(value)
        if text not in AUTOCAST:
            raise ctx.error(node, path, f"unknown autocast value {value!r}", ", ".join(AUTOCAST))
        return text
    if axis == "mesh":
        # YAML 1.1 reads some typos as numbers (0x2 is hex 2): report the text as written.
        text = value if isinstance(value, str) else str(getattr(node, "value", value))
        try:
            if not isinstance(value, str):
                raise ValueError(text)
            Mesh.parse(value)
        except ValueError:
            raise ctx.error(
                node,
                path,
                f"malformed mesh {text!r}: expected 'RxC' with positive integers",
                "e.g. 1x1, 1x2, 2x2, 2x3, 3x3",
            ) from None
        return value
    if not isinstance(value, str):
        raise ctx.error(node, path, f"expected a string for {axis}, got {value!r}")
    if axis == "dtype" and value in DTYPE_ALIASES:  # torch's spelling: float32 is fp32
        return DTYPE_ALIASES[value]
    vocab = {"level": LEVELS, "dtype": DTYPES, "path": PATHS}[axis]
    if value not in vocab:
        raise ctx.error(node, path, f"unknown {axis} {value!r}", ", ".join(vocab),
                        suggestion(value, vocab))
    return value


def extra_value_text(ctx: SpecReader, value: Scalar, node: yaml.Node, path: str) -> str:
    """An extra axis's value as it appears in a cell id, refused if it cannot."""
    text = render(value)
    if not VALUE_RE.match(text):
        raise ctx.error(
            node, path, f"value {value!r} cannot appear in a cell id",
            "letters, digits, '_', '.', '+' and '-'",
        )
    return text


def axis_list(ctx: SpecReader, axis: str, node: yaml.Node, path: str) -> tuple[str, ...]:
    values: list[str] = []
    for value, item, ipath in ctx.scalar_list(node, path):
        text = axis_value(ctx, axis, value, item, ipath)
        if text in values:
            raise ctx.error(item, ipath, f"duplicate {axis} value {text!r}")
        values.append(text)
        if axis == "mesh":
            ctx.mesh_nodes[(path, text)] = (item, ipath)
    return tuple(values)


def where_of(ctx: SpecReader, node: yaml.Node) -> str:
    return f"{ctx.file}:{node.start_mark.line + 1}"
