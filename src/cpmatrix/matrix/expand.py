"""Matrix -> ordered cells: product, exclude, include, then constraints. Pure.

Semantics (documented in the README):

1. For each target (file order) and each of its platforms, take the cartesian
   product of its mesh, dtype, autocast and path values and its extra axes.
2. ``exclude``: every combination matching a clause (all its keys match) is removed.
3. ``include``: each clause adds combinations after the excludes, so an include can
   bring an excluded cell back (it keeps its place in the product order; new
   combinations follow the product, in clause order). Keys the clause leaves out
   take every value the target has; a clause without ``target`` applies to every
   target that declares all the extra axes it names. Duplicates are merged. An
   include that applies to no target is an error.
4. Constraints, applied last, even to included cells:
   ``autocast=on`` only with bf16/fp16, and ``path=kernel`` never with fp64.

Every combination left out is reported with its reason (``Expansion.excluded``).

Example::

    >>> from cpmatrix.matrix.load import parse_matrix
    >>> m = parse_matrix('''
    ... version: 1
    ... platforms: {cpu: {backend: gloo, device: cpu, image: docker/cpu.Dockerfile}}
    ... targets:
    ...   - {name: t, case: "cpmatrix.matrix.schema:Mesh", level: unit, axes: {mesh: [1x1, 2x2]}}
    ... ''')
    >>> [c.id for c in expand(m).cells]
    ['t[unit,1x1,fp64,autocast=off,reference]@cpu', 't[unit,2x2,fp64,autocast=off,reference]@cpu']
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from cpmatrix.digest import ModuleSources, canonical_json, cell_digest_from_parts
from cpmatrix.errors import SpecError
from cpmatrix.matrix.cellid import format_cell_id, render_value
from cpmatrix.matrix.schema import (
    REDUCED_PRECISION,
    TARGET_AXES,
    Cell,
    Clause,
    Matrix,
    Mesh,
    Scalar,
    Target,
)

__all__ = ["CONSTRAINTS", "Collect", "Constraint", "Excluded", "Expansion", "expand"]


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


#: The fixed slots of a combination; a target's extra axes follow, in declaration order.
_FIXED_SLOTS: Final = ("platform", *TARGET_AXES)
_STANDARD_AXES: Final = TARGET_AXES

#: A combination as the text of each slot (what ids and clauses compare).
_Combo = tuple[str, ...]
#: A clause compiled against one target: (slot index, accepted texts) per condition.
_Compiled = tuple[tuple[int, frozenset[str]], ...]


def _matches(compiled: _Compiled, combo: _Combo) -> bool:
    """Whether every condition of a compiled clause accepts the combination."""
    return all(combo[slot] in accepted for slot, accepted in compiled)


def _target_platforms(matrix: Matrix, target: Target) -> tuple[str, ...]:
    return target.platforms or tuple(p.name for p in matrix.platforms)


def _located(where: str, yaml_path: str, message: str, allowed: str = "") -> SpecError:
    file, _, line = where.rpartition(":")
    return SpecError(file, int(line) if line.isdigit() else 0, 1, yaml_path, message, allowed)


class _Target:
    """One target's slots: their own values as text, and text -> typed value."""

    def __init__(self, matrix: Matrix, target: Target) -> None:
        self.target = target
        self.platforms = tuple(dict.fromkeys(_target_platforms(matrix, target)))
        self.slots = _FIXED_SLOTS + target.param_names
        self.index = {name: i for i, name in enumerate(self.slots)}
        own: list[tuple[Scalar, ...]] = [self.platforms]
        own += [target.axis(key) for key in _STANDARD_AXES]
        own += [values for _, values in target.params]
        self.own: list[tuple[str, ...]] = [tuple(render_value(v) for v in vs) for vs in own]
        self.typed: list[dict[str, Scalar]] = [
            {render_value(v): v for v in vs} for vs in own
        ]

    def compile(self, clause: Clause) -> _Compiled | None:
        """The clause's conditions by slot, or None when it cannot touch this target.

        It cannot when it names another target or level, an extra axis this target
        does not declare, or only platforms this target does not run on.
        """
        out: list[tuple[int, frozenset[str]]] = []
        for key, values in clause.conditions:
            accepted = frozenset(render_value(v) for v in values)
            if key == "target":
                if self.target.name not in accepted:
                    return None
            elif key == "level":
                if self.target.level not in accepted:
                    return None
            elif key in self.index:
                if key == "platform" and accepted.isdisjoint(self.platforms):
                    return None
                out.append((self.index[key], accepted))
            else:
                return None
        return tuple(out)

    def include_axes(self, clause: Clause) -> list[tuple[str, ...]]:
        """Per slot, the clause's values (as text) or, where it is silent, the target's."""
        axes = list(self.own)
        for key, values in clause.conditions:
            slot = self.index.get(key)
            if slot is None:
                continue
            texts: list[str] = []
            for value in values:
                text = render_value(value)
                if key == "platform" and text not in self.platforms:
                    continue
                known = self.typed[slot].setdefault(text, value)
                if type(known) is not type(value) or known != value:
                    raise _located(
                        clause.where, f"{clause.label}.{key}",
                        f"two cells with the same id: {key}={value!r} and {key}={known!r} "
                        f"of target {self.target.name!r} both render as {text!r}",
                        "values that differ as text",
                    )
                if text not in texts:
                    texts.append(text)
            axes[slot] = tuple(texts)
        return axes


class _Bucketed:
    """Clauses indexed by the target they name, so matching stays linear in cells."""

    def __init__(self, clauses: Iterable[Clause]) -> None:
        self.by_target: dict[str, list[tuple[int, Clause]]] = {}
        self.anywhere: list[tuple[int, Clause]] = []
        for order, clause in enumerate(clauses):
            names = clause.get("target")
            if names is None:
                self.anywhere.append((order, clause))
            else:
                for name in dict.fromkeys(render_value(n) for n in names):
                    self.by_target.setdefault(name, []).append((order, clause))

    def for_target(self, name: str) -> list[Clause]:
        """The clauses that may apply to target ``name``, in file order."""
        hits = self.by_target.get(name, []) + self.anywhere
        return [clause for _, clause in sorted(hits, key=lambda oc: oc[0])]


#: Collects a ``pytest:`` target's cells: ``(matrix, target, its index) -> cells``. The
#: pytest kind's (it runs pytest's collection in a subprocess), handed to :func:`expand`
#: by whoever expands a matrix that may hold such a target (the CLI, the gate).
Collect = Callable[[Matrix, Target, int], list[Cell]]


def _no_collect(matrix: Matrix, target: Target, index: int) -> list[Cell]:
    """No collector was handed: a ``pytest:`` target cannot be expanded (never silently
    left out: a gate would then require none of its cells)."""
    raise ValueError(f"{matrix.path}: targets[{index}] ({target.name!r}) is a pytest "
                     "target: expand() needs collect= to list its tests")


def _case_source_hash(matrix: Matrix, target: Target, ti: int,
                      source_of: Callable[[str], bytes], hashes: dict[str, bytes]) -> bytes:
    """The sha256 of the target's case module (read once per module, kept in ``hashes``);
    a module that cannot be found is a :class:`SpecError` at the target's ``case``."""
    module = target.case.split(":", 1)[0]
    if module not in hashes:
        try:
            hashes[module] = hashlib.sha256(source_of(module)).digest()
        except LookupError as exc:
            line, column = target.case_at
            file = target.where.rpartition(":")[0] or matrix.path
            raise SpecError(
                file, line, column, f"targets[{ti}].case",
                f"case module of {target.case!r} not found: {exc}",
                "a module on the matrix's pythonpath or sys.path",
            ) from None
    return hashes[module]


def _choose(t: _Target, excludes: _Bucketed, includes: _Bucketed,
            used_includes: set[int]) -> dict[_Combo, str | None]:
    """Every combination of one target -> why it is excluded (None: it is a cell).

    The product first, marked by the excludes; then what the includes add. Insertion
    order is the output order; an include re-marks an excluded combination in place.
    Records in ``used_includes`` each include that touched this target.
    """
    chosen: dict[_Combo, str | None] = {}
    compiled = [
        (c, k) for c in excludes.for_target(t.target.name)
        if (k := t.compile(c)) is not None
    ]
    for combo in itertools.product(*t.own):
        hit = next((c for c, k in compiled if _matches(k, combo)), None)
        chosen[combo] = None if hit is None else f"{hit.label} ({hit.where})"
    for clause in includes.for_target(t.target.name):
        if t.compile(clause) is None:
            continue
        used_includes.add(id(clause))
        for combo in itertools.product(*t.include_axes(clause)):
            chosen[combo] = None
    return chosen


def expand(matrix: Matrix, source_of: Callable[[str], bytes] | None = None,
           collect: Collect | None = None) -> Expansion:
    """Expand ``matrix`` into its ordered cells and the combinations it left out.

    Cells come target by target (file order); within a target, platform then the
    product of mesh, dtype, autocast, path and the extra axes (each in its declared
    order), and after those the combinations only an include adds. Linear in the
    number of combinations: clauses are compiled once per target they can touch.

    ``source_of(module) -> bytes`` reads a case module's source for the digest; by
    default modules are looked up on the matrix's ``pythonpath`` then ``sys.path``.
    A ``pytest:`` target's cells are its collected tests (``collect``, the pytest kind's
    collector handed down by the caller: the spec does not run pytest); excludes and
    includes do not apply to them (select with ``-k``/``--tag``).

    Raises :class:`SpecError` when a case module is missing, an include applies to
    no target, two cells share an id, or a pytest target collects nothing;
    :class:`ValueError` for a pytest target and no ``collect``.
    """
    if source_of is None:
        source_of = ModuleSources(matrix.pythonpath).read
    platform_json = {p.name: canonical_json(p.to_dict()) for p in matrix.platforms}
    source_hashes: dict[str, bytes] = {}
    meshes: dict[str, Mesh] = {}
    excludes = _Bucketed(matrix.exclude)
    includes = _Bucketed(matrix.include)
    used_includes: set[int] = set()
    cells: list[Cell] = []
    excluded: list[Excluded] = []

    for ti, target in enumerate(matrix.targets):
        if target.pytest:
            cells.extend((collect or _no_collect)(matrix, target, ti))
            continue
        source_hash = _case_source_hash(matrix, target, ti, source_of, source_hashes)
        t = _Target(matrix, target)
        chosen = _choose(t, excludes, includes, used_includes)
        for combo, reason in chosen.items():
            platform, mesh, dtype, autocast, path = combo[:5]
            params = tuple(
                (name, t.typed[5 + i][text])
                for i, (name, text) in enumerate(zip(target.param_names, combo[5:], strict=True))
            )
            ac = autocast == "on"
            cid = format_cell_id(target.name, target.level, mesh, dtype, ac, path, params,
                                 platform)
            if reason is not None:
                excluded.append(Excluded(cid, reason))
                continue
            if mesh not in meshes:
                meshes[mesh] = Mesh.parse(mesh)
            # One dict for the probe and the final cell: building a Cell twice is
            # cheaper than dataclasses.replace, and rejected cells never get a digest.
            fields: dict[str, Any] = {
                "id": cid, "target": target.name, "case": target.case, "kind": target.kind,
                "level": target.level, "mesh": meshes[mesh], "dtype": dtype, "autocast": ac,
                "path": path, "params": params, "platform": platform,
                "timeout_s": target.timeout_s, "tags": target.tags,
            }
            if target.spill is not None:
                p = dict(params)
                fields["spill"] = json.dumps(
                    target.spill.for_cell(target.case, str(p["config"]), str(p["arch"])),
                    sort_keys=True)
            probe = Cell(**fields)
            broken = next((k for k in CONSTRAINTS if k.reject(probe)), None)
            if broken is not None:
                excluded.append(Excluded(cid, f"constraint {broken.name}: {broken.reason}"))
                continue
            spec = probe.to_dict()
            del spec["digest"]
            digest = cell_digest_from_parts(
                canonical_json(spec), source_hash, platform_json[platform]
            )
            cells.append(Cell(**fields, digest=digest))

    for clause in matrix.include:
        if id(clause) not in used_includes:
            raise _located(
                clause.where, clause.label,
                f"{clause.label} applies to no target: no target has the target, level, "
                "platform and extra axes it names",
            )
    return Expansion(cells=tuple(cells), excluded=tuple(excluded))
