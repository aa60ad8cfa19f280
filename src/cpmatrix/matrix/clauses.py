"""``exclude`` and ``include`` clauses: partial combinations, validated against the targets.

A clause names axes (standard ones, ``target``, ``platform``, or the extra axes of the
targets it can touch) and the values it accepts. An exclude naming a value no target has
would silently match nothing, so it is an error; an include may add new values, but never
one that renders like an existing value of another type (two cells with one id).
"""

from __future__ import annotations

import yaml

from cpmatrix.matrix.axes import axis_value, extra_value_text, where_of
from cpmatrix.matrix.schema import ALLOWED_KEYS, AXES, Clause, Scalar, Target
from cpmatrix.matrix.yamlreader import SpecReader, render
from cpmatrix.suggest import suggestion

__all__ = ["clause"]


def _same_scalar(a: Scalar, b: Scalar) -> bool:
    """Equal values of the same type (``7`` and ``"7"`` render alike but differ)."""
    return type(a) is type(b) and a == b


def clause(
    ctx: SpecReader,
    node: yaml.Node,
    path: str,
    label: str,
    targets: tuple[Target, ...],
    platforms: tuple[str, ...],
    is_include: bool,
) -> Clause:
    entries = list(ctx.mapping(node, path, None))
    # Which targets the clause can touch decides which extra axes it may name, so
    # read ``target`` first wherever it stands in the mapping.
    scope = targets
    names = [t.name for t in targets]
    for key, _, value_node in entries:
        if key == "target":
            named = set()
            for value, item, ipath in ctx.scalar_list(value_node, f"{path}.target"):
                if value not in names:
                    raise ctx.error(item, ipath, f"unknown target {value!r}", ", ".join(names))
                named.add(value)
            scope = tuple(t for t in targets if t.name in named)
    declared: dict[str, list[Scalar]] = {}
    for t in scope:
        for pname, pvalues in t.params:
            declared.setdefault(pname, []).extend(pvalues)
    all_params = {pname for t in targets for pname in t.param_names}
    allowed = ALLOWED_KEYS["clause"] + tuple(sorted(declared))

    conditions: list[tuple[str, tuple[Scalar, ...]]] = []
    for key, key_node, value_node in entries:
        kpath = f"{path}.{key}"
        if key not in allowed:
            if key in all_params:
                owners = ", ".join(t.name for t in targets if key in t.param_names)
                raise ctx.error(
                    key_node, kpath,
                    f"extra axis {key!r} is not declared by the target(s) this clause names"
                    f" (declared by: {owners})",
                    ", ".join(allowed),
                )
            raise ctx.error(key_node, kpath, f"unknown key {key!r}", ", ".join(allowed),
                            suggestion(key, [*allowed, *sorted(all_params)]))
        values: list[Scalar] = []
        for value, item, ipath in ctx.scalar_list(value_node, kpath):
            if key == "target":
                values.append(str(value))
            elif key == "platform":
                if value not in platforms:
                    raise ctx.error(
                        item, ipath, f"unknown platform {value!r}", ", ".join(platforms)
                    )
                values.append(str(value))
            elif key in AXES:
                values.append(axis_value(ctx, key, value, item, ipath))
                if key == "mesh":
                    ctx.mesh_nodes[(kpath, str(values[-1]))] = (item, ipath)
            else:
                _check_extra_value(ctx, key, value, item, ipath, declared[key], is_include)
                values.append(value)
        conditions.append((key, tuple(values)))
    if not conditions:
        raise ctx.error(node, path, "empty clause: name at least one axis")
    return Clause(conditions=tuple(conditions), where=where_of(ctx, node), label=label)


def _check_extra_value(
    ctx: SpecReader,
    key: str,
    value: Scalar,
    item: yaml.Node,
    ipath: str,
    declared: list[Scalar],
    is_include: bool,
) -> None:
    """Check one value a clause gives an extra axis against the values the targets in
    its scope ``declared`` for it: known (an exclude), fit for a cell id, no look-alike
    of a declared value of another type (an include)."""
    text = render(value)
    known = sorted({render(v) for v in declared})
    # An exclude naming a value no target has would silently match nothing;
    # an include may add new values, but not ones that only look like old ones.
    if not is_include and text not in known:
        raise ctx.error(
            item, ipath, f"unknown value {value!r} for extra axis {key!r}",
            ", ".join(known),
        )
    extra_value_text(ctx, value, item, ipath)
    # Excludes compare rendered text, so only an include can make a twin.
    clash = next(
        (v for v in declared if render(v) == text and not _same_scalar(v, value)),
        None,
    )
    if is_include and clash is not None:
        raise ctx.error(
            item, ipath,
            f"two cells with the same id: {key}={value!r} "
            f"({type(value).__name__}) renders like the target's {key}={clash!r} "
            f"({type(clash).__name__}) as {text!r}",
            f"write it as the target does: {key}: {clash!r}",
        )
