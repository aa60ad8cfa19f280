"""Gate policies: the named entries of ``matrix/gates.yaml``, validated once.

Example::

    >>> Policy(name="p", drift_factor=2.0).drift_limit(0.0)   # the floor, not zero
    2e-12
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from cpmatrix.errors import UsageError
from cpmatrix.matrix.schema import Cell
from cpmatrix.matrix.select import parse_keyword_expr
from cpmatrix.matrix.yamlreader import SpecReader, compose, read_spec_text

__all__ = ["DEFAULT_DRIFT_KEYS", "POLICY_KEYS", "Policy", "expected_cells", "load_policies"]

#: Evidence keys (``fnmatch`` patterns) holding a cell's max error: the toolkit records
#: ``<label>.max_abs`` / ``<label>.max_rel``; hand-written cases often ``max_abs_diff``.
DEFAULT_DRIFT_KEYS: Final = ("max_abs_diff", "max_rel_diff", "max_abs_err", "*.max_abs",
                             "*.max_rel")
_NAME_RE: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """One named gate policy (an entry of ``policies:`` in ``gates.yaml``)."""

    name: str
    description: str = ""
    #: Required cells carry every one of these tags (none: every cell).
    tags: tuple[str, ...] = ()
    #: Required cells run on one of these platforms (none: any).
    platforms: tuple[str, ...] = ()
    #: A ``-k`` expression over cell ids and tags, as for ``cpmatrix run -k``.
    keyword: str | None = None
    #: Matrix files (resolved paths) whose selected cells must all be in the report.
    matrices: tuple[Path, ...] = ()
    allow_skipped: bool = False
    allow_flaky: bool = False
    #: Fraction of mutant runs that must be killed (1.0: all of them).
    min_kill_rate: float = 1.0
    #: A max error may grow by at most this factor against the baseline (None: no check).
    drift_factor: float | None = None
    #: Baseline errors below this count as this much: 0 -> 1e-16 is noise, not drift.
    drift_floor: float = 1e-12
    drift_keys: tuple[str, ...] = DEFAULT_DRIFT_KEYS

    def __post_init__(self) -> None:
        # The loader reports these with file and line; this guards policies built in code.
        if not 0.0 <= self.min_kill_rate <= 1.0:
            raise ValueError(f"min_kill_rate must be in [0, 1], got {self.min_kill_rate}")
        if self.drift_factor is not None and not self.drift_factor >= 1.0:
            raise ValueError(f"drift_factor must be >= 1 (or None), got {self.drift_factor}")
        if not self.drift_floor >= 0.0:
            raise ValueError(f"drift_floor must be >= 0, got {self.drift_floor}")

    def drift_limit(self, baseline: float) -> float:
        """The largest error allowed for a cell whose baseline error was ``baseline``."""
        assert self.drift_factor is not None
        return self.drift_factor * max(baseline, self.drift_floor)

    def scope(self) -> Callable[[str, str, Sequence[str]], bool]:
        """A predicate ``(cell_id, platform, tags) -> required?``."""
        expr = parse_keyword_expr(self.keyword) if self.keyword is not None else None

        def required(cell_id: str, platform: str, tags: Sequence[str]) -> bool:
            if self.platforms and platform not in self.platforms:
                return False
            if not all(t in tags for t in self.tags):
                return False
            return expr is None or expr.matches([cell_id, *tags])

        return required

    def describe_scope(self) -> str:
        parts = [f"tags [{', '.join(self.tags)}]" if self.tags else "all tags"]
        if self.platforms:
            parts.append(f"platforms [{', '.join(self.platforms)}]")
        if self.keyword is not None:
            parts.append(f"-k {self.keyword!r}")
        return ", ".join(parts)


def _policy(reader: SpecReader, name: str, key_node: yaml.Node, body: yaml.Node,
            base: Path) -> Policy:
    at = f"policies.{name}"
    if not _NAME_RE.match(name):
        raise reader.error(key_node, at, f"policy name {name!r} must be letters, digits, _ . -")
    if not isinstance(body, yaml.MappingNode):
        raise reader.error(body, at, "must be a mapping of settings, got "
                           f"{reader.loader.construct_object(body, deep=True)!r}")
    fields: dict[str, Any] = {"name": name}
    for key, _, value in reader.mapping(body, at, POLICY_KEYS):
        fields.update(_field(reader, key, value, f"{at}.{key}", base))
    return Policy(**fields)


def _field(reader: SpecReader, key: str, node: yaml.Node, path: str,
           base: Path) -> dict[str, Any]:
    if key == "description":
        value = reader.loader.construct_object(node, deep=True)
        if not isinstance(value, str):
            raise reader.error(node, path, f"must be a string, got {value!r}")
        return {"description": value}
    if key in ("tags", "platforms", "drift_keys"):
        return {key: reader.string_list(node, path)}
    if key == "matrix":
        return {"matrices": tuple(base / p for p in reader.string_list(node, path))}
    if key == "keyword":
        value = reader.loader.construct_object(node, deep=True)
        if not isinstance(value, str):
            raise reader.error(node, path, f"must be a -k expression string, got {value!r}")
        try:
            parse_keyword_expr(value)
        except UsageError as exc:
            raise reader.error(node, path, str(exc)) from None
        return {"keyword": value}
    if key in ("allow_skipped", "allow_flaky"):
        return {key: reader.flag(node, path)}
    if key == "min_kill_rate":
        return {key: reader.number_in(node, path, low=0.0, high=1.0)}
    if key == "drift_factor":
        # Below 1 would flag a cell whose error did not grow at all.
        if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
            return {key: None}
        return {key: reader.number_in(node, path, low=1.0, high=math.inf)}
    assert key == "drift_floor", key  # mapping() admits only POLICY_KEYS
    return {key: reader.number_in(node, path, low=0.0, high=math.inf)}


#: Every key a policy may set (documented in ``matrix/gates.yaml``).
POLICY_KEYS: Final = ("description", "tags", "platforms", "keyword", "matrix", "allow_skipped",
                      "allow_flaky", "min_kill_rate", "drift_factor", "drift_floor",
                      "drift_keys")


def load_policies(path: str | os.PathLike[str]) -> dict[str, Policy]:
    """Read and validate a gates file: ``{"version": 1, "policies": {name: {...}}}``.

    Read with the matrix's own reader (:mod:`cpmatrix.matrix.yamlreader`): the same
    located errors, duplicate keys refused. Raises :class:`SpecError` (exit 2).

    >>> import tempfile, pathlib
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "gates.yaml"
    >>> _ = f.write_text("version: 1\npolicies:\n  r: {tags: [release], allow_flaky: yes}\n")
    >>> load_policies(f)["r"].tags
    ('release',)
    """
    file = os.fspath(path)
    reader, root = compose(read_spec_text(file, "gates"), file, what="gates")
    try:
        sections = {key: (key_node, value)
                    for key, key_node, value in reader.mapping(root, "", ("version", "policies"))}
        if "version" not in sections:
            raise reader.error(root, "version", "must be 1, got None")
        version = reader.loader.construct_object(sections["version"][1], deep=True)
        if version != 1 or isinstance(version, bool):
            raise reader.error(sections["version"][1], "version", f"must be 1, got {version!r}")
        policies = sections.get("policies", (root, root))[1]
        if "policies" not in sections or not isinstance(policies, yaml.MappingNode) \
                or not policies.value:
            raise reader.error(policies, "policies", "must map policy names to their settings")
        base = Path(file).parent
        return {name: _policy(reader, name, key_node, body, base)
                for name, key_node, body in reader.mapping(policies, "policies", None)}
    finally:
        reader.loader.dispose()


def expected_cells(policy: Policy, cells: Sequence[Cell] | None = None,
                   ) -> list[tuple[str, str, tuple[str, ...]]]:
    """``(id, platform, tags)`` of every required cell of the policy's matrix files;
    ``cells``: those files' cells when the caller expanded them already (the gate, for
    their digests: a ``pytest:`` target's collection then runs once)."""
    from cpmatrix.kinds.pytest.collect import collect_target
    from cpmatrix.matrix.expand import expand
    from cpmatrix.matrix.load import load_matrix

    required = policy.scope()
    if cells is None:
        # Digests are not needed here: skip reading case sources (and their absence).
        cells = [cell for path in policy.matrices
                 for cell in expand(load_matrix(path), source_of=lambda _module: b"",
                                    collect=collect_target).cells]
    return [(c.id, c.platform, c.tags) for c in cells if required(c.id, c.platform, c.tags)]
