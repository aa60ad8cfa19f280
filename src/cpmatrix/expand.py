"""Matrix -> ordered cells: product, exclude, include, then constraints. Pure.

Semantics (documented in the README):

1. For each target (file order) and each of its platforms, take the cartesian
   product of its mesh, dtype, autocast and path values and its extra axes.
2. ``exclude``: every combination matching a clause (all its keys match) is removed.
3. ``include``: each clause adds combinations after the excludes, so an include can
   bring an excluded cell back. Keys the clause leaves out take every value the
   target has; a clause without ``target`` applies to every target that declares
   all the extra axes it names. Duplicates are merged.
4. Constraints, applied last, even to included cells:
   ``autocast=on`` only with bf16/fp16, and ``path=kernel`` never with fp64.

Example::

    >>> from cpmatrix.load import parse_matrix
    >>> m = parse_matrix('''
    ... version: 1
    ... platforms: {cpu: {backend: gloo, device: cpu, image: docker/cpu.Dockerfile}}
    ... targets:
    ...   - {name: t, case: "cpmatrix.spec:Mesh", level: unit, axes: {mesh: [1x1, 2x2]}}
    ... ''')
    >>> [c.id for c in expand(m).cells]
    ['t[unit,1x1,fp64,autocast=off,reference]@cpu', 't[unit,2x2,fp64,autocast=off,reference]@cpu']
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from .cellid import format_cell_id, render_value
from .digest import ModuleSources, cell_digest
from .errors import SpecError
from .spec import REDUCED_PRECISION, Cell, Clause, Matrix, Mesh, Scalar, Target

__all__ = ["CONSTRAINTS", "Constraint", "Excluded", "Expansion", "expand"]


@dataclass(frozen=True, slots=True)
class Constraint:
    """A rule the tool applies after include; ``reject`` says why a cell is invalid."""

    name: str
    reason: str
    reject: Callable[[Cell], bool]


CONSTRAINTS: Final = (
    Constraint(
        "autocast-needs-reduced-precision",
        "autocast=on only with a reduced-precision dtype (bf16, fp16)",
        lambda c: c.autocast and c.dtype not in REDUCED_PRECISION,
    ),
    Constraint(
        "kernel-not-fp64",
        "path=kernel never with fp64 (Triton kernels are fp32/bf16)",
        lambda c: c.path == "kernel" and c.dtype == "fp64",
    ),
)


@dataclass(frozen=True, slots=True)
class Excluded:
    """A combination that is not a cell, and why (shown by ``list --why-excluded``)."""

    id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Expansion:
    cells: tuple[Cell, ...]
    excluded: tuple[Excluded, ...]


def _matches(clause: Clause, cell: Cell) -> bool:
    for key, values in clause.conditions:
        actual = cell.axis_value(key)
        if actual is None:
            return False
        if render_value(actual) not in {render_value(v) for v in values}:
            return False
    return True


def _target_platforms(matrix: Matrix, target: Target) -> tuple[str, ...]:
    return target.platforms or tuple(p.name for p in matrix.platforms)


class _Builder:
    def __init__(self, matrix: Matrix, source_of: Callable[[str], bytes]) -> None:
        self.matrix = matrix
        self.source_of = source_of
        self._platform_dicts = {p.name: p.to_dict() for p in matrix.platforms}
        self._sources: dict[str, bytes] = {}

    def source(self, target: Target) -> bytes:
        module = target.case.split(":", 1)[0]
        if module not in self._sources:
            try:
                self._sources[module] = self.source_of(module)
            except LookupError as exc:
                file, _, line = target.where.rpartition(":")
                raise SpecError(
                    file, int(line or 0), 1, f"targets[{self.index(target)}].case",
                    f"case module of {target.case!r} not found: {exc}",
                    "a module on the matrix's pythonpath or sys.path",
                ) from None
        return self._sources[module]

    def index(self, target: Target) -> int:
        return self.matrix.targets.index(target)

    def cell(
        self,
        target: Target,
        platform: str,
        mesh: str,
        dtype: str,
        autocast: str,
        path: str,
        params: tuple[tuple[str, Scalar], ...],
    ) -> Cell:
        ac = autocast == "on"
        cid = format_cell_id(target.name, target.level, mesh, dtype, ac, path, params, platform)
        cell = Cell(
            id=cid,
            target=target.name,
            case=target.case,
            kind=target.kind,
            level=target.level,
            mesh=Mesh.parse(mesh),
            dtype=dtype,
            autocast=ac,
            path=path,
            params=params,
            platform=platform,
            timeout_s=target.timeout_s,
            tags=target.tags,
        )
        spec = cell.to_dict()
        del spec["digest"]
        digest = cell_digest(spec, self.source(target), self._platform_dicts[platform])
        return dataclasses.replace(cell, digest=digest)

    def combos(
        self, target: Target, clause: Clause | None = None
    ) -> Iterable[tuple[str, str, str, str, str, tuple[tuple[str, Scalar], ...]]]:
        def pick(key: str, own: tuple[Scalar, ...]) -> tuple[Scalar, ...]:
            if clause is None:
                return own
            given = clause.get(key)
            return own if given is None else given

        platforms = pick("platform", _target_platforms(self.matrix, target))
        axes = [pick(key, target.axis(key)) for key in ("mesh", "dtype", "autocast", "path")]
        params = [pick(name, values) for name, values in target.params]
        names = target.param_names
        for platform in platforms:
            for mesh, dtype, autocast, path, *pvals in itertools.product(*axes, *params):
                yield (
                    str(platform), str(mesh), str(dtype), str(autocast), str(path),
                    tuple(zip(names, pvals, strict=True)),
                )


def _applies(clause: Clause, target: Target, matrix: Matrix) -> bool:
    names = clause.get("target")
    if names is not None:
        if target.name not in names:
            return False
    else:
        declared = set(target.param_names)
        for key, _ in clause.conditions:
            if key not in ("target", "platform", "level", "mesh", "dtype", "autocast", "path") \
                    and key not in declared:
                return False
    levels = clause.get("level")
    if levels is not None and target.level not in levels:
        return False
    platforms = clause.get("platform")
    own = _target_platforms(matrix, target)
    return platforms is None or any(p in own for p in platforms)


def expand(matrix: Matrix, source_of: Callable[[str], bytes] | None = None) -> Expansion:
    """Expand ``matrix`` into its ordered cells and the combinations it left out.

    ``source_of(module) -> bytes`` reads a case module's source for the digest; by
    default modules are looked up on the matrix's ``pythonpath`` then ``sys.path``.
    Raises :class:`SpecError` when a case module is missing or two cells share an id.
    """
    if source_of is None:
        source_of = ModuleSources(matrix.pythonpath).read
    b = _Builder(matrix, source_of)
    per_target: list[dict[str, Cell]] = []
    excluded: dict[str, Excluded] = {}

    for target in matrix.targets:
        cells: dict[str, Cell] = {}
        for combo in b.combos(target):
            cell = b.cell(target, *combo)
            hit = next((c for c in matrix.exclude if _matches(c, cell)), None)
            if hit is not None:
                excluded[cell.id] = Excluded(cell.id, f"{hit.label} ({hit.where})")
            else:
                cells[cell.id] = cell
        per_target.append(cells)

    for clause in matrix.include:
        for ti, target in enumerate(matrix.targets):
            if not _applies(clause, target, matrix):
                continue
            for combo in b.combos(target, clause):
                if combo[0] not in _target_platforms(matrix, target):
                    continue
                cell = b.cell(target, *combo)
                existing = per_target[ti].get(cell.id)
                if existing is not None and existing.params != cell.params:
                    file, _, line = clause.where.rpartition(":")
                    raise SpecError(
                        file, int(line or 0), 1, clause.label,
                        f"two cells with the same id {cell.id!r}: parameter values "
                        f"{dict(existing.params)} and {dict(cell.params)} render alike",
                        "values that differ as text",
                    )
                per_target[ti][cell.id] = cell
                excluded.pop(cell.id, None)

    out: list[Cell] = []
    for cells in per_target:
        for cell in cells.values():
            broken = next((k for k in CONSTRAINTS if k.reject(cell)), None)
            if broken is not None:
                excluded[cell.id] = Excluded(cell.id, f"constraint {broken.name}: {broken.reason}")
            else:
                out.append(cell)
    return Expansion(cells=tuple(out), excluded=tuple(excluded.values()))
