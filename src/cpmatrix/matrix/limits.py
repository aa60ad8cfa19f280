"""Resource sanity at load time: limits a matrix must keep before it is expanded.

A mesh above its platform's ``max_ranks`` would start that many processes on one world; a
product above ``max_cells`` would fill memory while expanding. Both are spec errors at the
value's line, with the numbers.
"""

from __future__ import annotations

import yaml

from cpmatrix.matrix.schema import Clause, Mesh, Platform, Target
from cpmatrix.matrix.yamlreader import SpecReader

__all__ = ["check_ranks", "check_size"]


def _target_platforms(target: Target, platforms: tuple[Platform, ...]) -> list[Platform]:
    return [p for p in platforms if not target.platforms or p.name in target.platforms]


def check_ranks(ctx: SpecReader, platforms: tuple[Platform, ...], targets: list[Target],
                 includes: list[Clause], sections: dict[str, yaml.Node]) -> None:
    """Every mesh a cell can get fits the ``max_ranks`` of each platform it runs on."""

    def check(mesh: str, on: list[Platform], node: yaml.Node, path: str) -> None:
        size = Mesh.parse(mesh).world_size
        for p in on:
            if size > p.max_ranks:
                raise ctx.error(
                    node, path, f"mesh {mesh} needs {size} ranks, above platforms.{p.name}."
                    f"max_ranks ({p.max_ranks}): that many processes would start on one "
                    "world", f"meshes up to {p.max_ranks} ranks, or raise max_ranks")

    for i, target in enumerate(targets):
        on = _target_platforms(target, platforms)
        for source in (f"targets[{i}].axes.mesh", "defaults.mesh"):
            found = [(m, ctx.mesh_nodes[(source, m)]) for m in target.axis("mesh")
                     if (source, m) in ctx.mesh_nodes]
            for mesh, (node, path) in found:
                check(mesh, on, node, path)
            if found:
                break
        else:  # the built-in default (1x1)
            for mesh in target.axis("mesh"):
                check(mesh, on, sections["targets"], f"targets[{i}]")
    for clause in includes:
        meshes = clause.get("mesh")
        if not meshes:
            continue
        names = clause.get("platform")
        scoped = clause.get("target")
        on = [p for p in platforms if names is None or p.name in names]
        if scoped is not None:
            allowed = {p.name for t in targets if t.name in scoped
                       for p in _target_platforms(t, platforms)}
            on = [p for p in on if p.name in allowed]
        for value in meshes:
            node, path = ctx.mesh_nodes[(f"{clause.label}.mesh", str(value))]
            check(str(value), on, node, path)


def check_size(ctx: SpecReader, platforms: tuple[Platform, ...], targets: list[Target],
                includes: list[Clause], limit: int, sections: dict[str, yaml.Node]) -> None:
    """Refuse a matrix whose product exceeds ``limit`` cells, before expanding it."""
    total = 0
    for target in targets:
        count = len(_target_platforms(target, platforms))
        for _, values in target.axes:
            count *= len(values)
        for _, pvalues in target.params:
            count *= len(pvalues)
        total += count
    for clause in includes:  # an upper bound: each include adds at most its own product
        scoped = clause.get("target")
        for target in targets:
            if scoped is not None and target.name not in scoped:
                continue
            count = 1
            slots: list[tuple[str, int]] = [
                ("platform", len(_target_platforms(target, platforms))),
                *((k, len(v)) for k, v in target.axes), *((k, len(v)) for k, v in target.params)]
            for key, size in slots:
                given = clause.get(key)
                count *= len(given) if given is not None else size
            total += count
    if total > limit:
        raise ctx.error(
            sections["targets"], "targets",
            f"the matrix would expand to {total:,} cells (before exclusions), above max_cells "
            f"({limit:,})", "set a larger 'max_cells:' at the top of the matrix if you mean it",
        )
