"""The ``spill:`` block of a ``kind: spill`` target: what its kernel compiles to.

Example::

    >>> reader, node = compose("{signature: {x: '*fp32'}, configs: {b: {BLOCK: 64}}}", "m")
    >>> spill_block(reader, node, "targets[0].spill").configs
    (('b', (('BLOCK', 64),)),)
"""

from __future__ import annotations

import yaml

from cpmatrix.matrix.schema import ALLOWED_KEYS, ARCHS, ENV_NAME_RE, VALUE_RE, Scalar, SpillBlock
from cpmatrix.matrix.yamlreader import SpecReader

__all__ = ["spill_block"]


def spill_block(ctx: SpecReader, node: yaml.Node, path: str) -> SpillBlock:
    """The ``spill:`` block of a ``kind: spill`` target."""
    values: dict[str, object] = {}
    nodes: dict[str, yaml.Node] = {}
    for key, _, value_node in ctx.mapping(node, path, ALLOWED_KEYS["target.spill"]):
        nodes[key] = value_node
    if "signature" in nodes:
        sig: list[tuple[str, str]] = []
        for name, key_node, value_node in ctx.mapping(nodes["signature"], f"{path}.signature",
                                                      None):
            if not ENV_NAME_RE.match(name):
                raise ctx.error(key_node, f"{path}.signature.{name}",
                                f"bad parameter name {name!r}")
            sig.append((name, ctx.string(value_node, f"{path}.signature.{name}")))
        values["signature"] = tuple(sig)
    if "table" in nodes:
        values["table"] = ctx.string(nodes["table"], f"{path}.table")
        if not ENV_NAME_RE.match(str(values["table"])):
            raise ctx.error(nodes["table"], f"{path}.table",
                            f"bad table name {values['table']!r}", "a module attribute name")
    if ("signature" in values) == ("table" in values):
        raise ctx.error(node, path, "give exactly one of 'signature' (with 'configs') or "
                        "'table' (a SPILL_SPECS-style dict in the kernel's module)")
    if "configs" in nodes:
        configs: list[tuple[str, tuple[tuple[str, Scalar], ...]]] = []
        for name, key_node, value_node in ctx.mapping(nodes["configs"], f"{path}.configs", None):
            cpath = f"{path}.configs.{name}"
            if not VALUE_RE.match(name):
                raise ctx.error(key_node, cpath, f"bad config name {name!r}",
                                "letters, digits, '_', '.', '+' and '-'")
            consts = tuple((k, ctx.scalar(v, f"{cpath}.{k}"))
                           for k, _, v in ctx.mapping(value_node, cpath, None))
            configs.append((name, consts))
        if not configs:
            raise ctx.error(nodes["configs"], f"{path}.configs", "no config declared")
        values["configs"] = tuple(configs)
    elif "signature" in values:
        raise ctx.error(node, path, "a 'signature' needs 'configs' (name -> constexpr values)")
    if "archs" in nodes:
        archs = []
        for value, item, ipath in ctx.scalar_list(nodes["archs"], f"{path}.archs"):
            if value not in ARCHS:
                raise ctx.error(item, ipath, f"unknown arch {value!r}", ", ".join(ARCHS))
            if value in archs:
                raise ctx.error(item, ipath, f"duplicate arch {value!r}")
            archs.append(str(value))
        values["archs"] = tuple(archs)
    for key, low in (("num_warps", 1), ("num_stages", 1), ("budget_bytes", 0)):
        if key in nodes:
            v = ctx.scalar(nodes[key], f"{path}.{key}")
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ctx.error(nodes[key], f"{path}.{key}", f"bad {key} {v!r}",
                                f"an integer >= {low}")
            if key == "num_warps" and v & (v - 1):
                raise ctx.error(nodes[key], f"{path}.{key}", f"num_warps {v} is not a power "
                                "of two", "1, 2, 4, 8, 16, 32")
            values[key] = v
    if "expect_spill" in nodes:
        v = ctx.scalar(nodes["expect_spill"], f"{path}.expect_spill")
        if not isinstance(v, bool):
            raise ctx.error(nodes["expect_spill"], f"{path}.expect_spill",
                            f"expected true or false, got {v!r}")
        values["expect_spill"] = v
    return SpillBlock(**values)  # type: ignore[arg-type]  # each value checked above
