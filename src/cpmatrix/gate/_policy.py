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

from cpmatrix.errors import SpecError, UsageError
from cpmatrix.matrix.load import read_spec_text, reject_duplicate_keys
from cpmatrix.matrix.select import parse_keyword_expr

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


def _line_of(root: yaml.Node | None, path: Sequence[str | int]) -> tuple[int, int]:
    """1-based line and column of the node at ``path`` (0, 0 when it cannot be found)."""
    node, found = root, (0, 0)
    for part in path:
        child: yaml.Node | None = None
        mark = None
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value == part:
                    # Point at the key: for an unknown key that is the whole story.
                    child, mark = v, k.start_mark
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) \
                and part < len(node.value):
            child = node.value[part]
            mark = child.start_mark
        if child is None or mark is None:
            break
        node = child
        found = (mark.line + 1, mark.column + 1)
    return found


class _Reader:
    """Validates one gates file, raising SpecError located at the offending key."""

    def __init__(self, file: str, root: yaml.Node | None) -> None:
        self.file, self.root = file, root

    def error(self, path: Sequence[str | int], message: str, allowed: str = "") -> SpecError:
        line, col = _line_of(self.root, path)
        dotted = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
        return SpecError(self.file, line, col, dotted, message, allowed)

    def strings(self, value: object, path: list[str | int]) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise self.error(path, f"must be a list of strings, got {value!r}")
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                raise self.error([*path, i], f"must be a non-empty string, got {item!r}")
        return tuple(value)

    def number(self, value: object, path: list[str | int], *, low: float, high: float) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not low <= value <= high or math.isnan(value):
            raise self.error(path, f"must be a number in [{low:g}, {high:g}], got {value!r}")
        return float(value)

    def flag(self, value: object, path: list[str | int]) -> bool:
        if not isinstance(value, bool):
            raise self.error(path, f"must be true or false, got {value!r}")
        return value

    def policy(self, name: str, body: object, base: Path) -> Policy:
        at: list[str | int] = ["policies", name]
        if not _NAME_RE.match(name):
            raise self.error(at, f"policy name {name!r} must be letters, digits, _ . -")
        if not isinstance(body, dict):
            raise self.error(at, f"must be a mapping of settings, got {body!r}")
        fields: dict[str, Any] = {"name": name}
        for key, value in body.items():
            path = [*at, key]
            fields.update(self.field(str(key), value, path, base))
        return Policy(**fields)

    def field(self, key: str, value: object, path: list[str | int], base: Path) -> dict[str, Any]:
        if key == "description":
            if not isinstance(value, str):
                raise self.error(path, f"must be a string, got {value!r}")
            return {"description": value}
        if key in ("tags", "platforms", "drift_keys"):
            return {key: self.strings(value, path)}
        if key == "matrix":
            return {"matrices": tuple(base / p for p in self.strings(value, path))}
        if key == "keyword":
            if not isinstance(value, str):
                raise self.error(path, f"must be a -k expression string, got {value!r}")
            try:
                parse_keyword_expr(value)
            except UsageError as exc:
                raise self.error(path, str(exc)) from None
            return {"keyword": value}
        if key in ("allow_skipped", "allow_flaky"):
            return {key: self.flag(value, path)}
        if key == "min_kill_rate":
            return {key: self.number(value, path, low=0.0, high=1.0)}
        if key == "drift_factor":
            # Below 1 would flag a cell whose error did not grow at all.
            return {key: None if value is None else self.number(value, path, low=1.0,
                                                                 high=math.inf)}
        if key == "drift_floor":
            return {key: self.number(value, path, low=0.0, high=math.inf)}
        raise self.error(path, f"unknown key {key!r}", ", ".join(POLICY_KEYS))


#: Every key a policy may set (documented in ``matrix/gates.yaml``).
POLICY_KEYS: Final = ("description", "tags", "platforms", "keyword", "matrix", "allow_skipped",
                      "allow_flaky", "min_kill_rate", "drift_factor", "drift_floor",
                      "drift_keys")


def load_policies(path: str | os.PathLike[str]) -> dict[str, Policy]:
    """Read and validate a gates file: ``{"version": 1, "policies": {name: {...}}}``.

    Raises :class:`SpecError` (exit 2) naming the file, line and key path.

    >>> import tempfile, pathlib
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "gates.yaml"
    >>> _ = f.write_text("version: 1\\npolicies:\\n  r: {tags: [release], allow_flaky: yes}\\n")
    >>> load_policies(f)["r"].tags
    ('release',)
    """
    file = os.fspath(path)
    text = read_spec_text(file, "gates")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (0, 0)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(file, line, col, "", f"invalid YAML: {problem}") from None
    reject_duplicate_keys(file, root)
    reader = _Reader(file, root)
    if not isinstance(data, dict):
        raise reader.error([], "must be a mapping with 'version: 1' and 'policies:'")
    for key in data:
        if key not in ("version", "policies"):
            raise reader.error([key], f"unknown key {key!r}", "version, policies")
    if data.get("version") != 1:
        raise reader.error(["version"], f"must be 1, got {data.get('version')!r}")
    policies = data.get("policies")
    if not isinstance(policies, dict) or not policies:
        raise reader.error(["policies"], "must map policy names to their settings")
    base = Path(file).parent
    return {str(name): reader.policy(str(name), body, base) for name, body in policies.items()}


def expected_cells(policy: Policy) -> list[tuple[str, str, tuple[str, ...]]]:
    """``(id, platform, tags)`` of every required cell of the policy's matrix files."""
    from cpmatrix.matrix.expand import expand
    from cpmatrix.matrix.load import load_matrix

    required = policy.scope()
    out = []
    for path in policy.matrices:
        # Digests are not needed here: skip reading case sources (and their absence).
        for cell in expand(load_matrix(path), source_of=lambda _module: b"").cells:
            if required(cell.id, cell.platform, cell.tags):
                out.append((cell.id, cell.platform, cell.tags))
    return out
