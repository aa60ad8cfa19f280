"""YAML -> :class:`~cpmatrix.matrix.schema.Matrix`: the only module that sees raw YAML.

It composes the document into PyYAML nodes (safe loader only) so every value keeps
its line and column, and turns any problem into a :class:`SpecError` that names
file:line:column, the YAML path, the bad value and what is allowed.

Example::

    >>> m = load_matrix("matrix/parity.yaml")      # doctest: +SKIP
    >>> [t.name for t in m.targets][:2]           # doctest: +SKIP
    ['allgather', 'ring_attention']
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import yaml

from cpmatrix.errors import SpecError
from cpmatrix.matrix.schema import (
    AUTOCAST,
    DTYPES,
    KINDS,
    LEVELS,
    MAX_CELLS,
    MAX_RANKS,
    MAX_TIMEOUT_S,
    NAME_RE,
    PATHS,
    TIMEOUT_CLASSES,
    VALUE_RE,
    Clause,
    Matrix,
    Mesh,
    Platform,
    Scalar,
    SpillBlock,
    Target,
    timeout_seconds,
)

__all__ = [
    "ALLOWED_KEYS",
    "load_matrix",
    "parse_matrix",
    "read_spec_text",
    "reject_duplicate_keys",
]

#: The schema's keys, per section. A test freezes this so it only grows on purpose.
ALLOWED_KEYS: Final[dict[str, tuple[str, ...]]] = {
    "matrix": ("version", "pythonpath", "defaults", "platforms", "targets", "exclude", "include",
               "max_cells"),
    "defaults": ("mesh", "dtype", "autocast", "path"),
    "platform": ("backend", "device", "image", "env", "description", "max_ranks"),
    "target": (
        "name",
        "case",
        "level",
        "kind",
        "tags",
        "timeout",
        "platforms",
        "axes",
        "params",
        "description",
        "spill",
    ),
    "target.axes": ("mesh", "dtype", "autocast", "path"),
    "target.spill": (
        "signature",
        "table",
        "configs",
        "archs",
        "num_warps",
        "num_stages",
        "budget_bytes",
        "expect_spill",
    ),
    "clause": ("target", "platform", "level", "mesh", "dtype", "autocast", "path"),
}

_BUILTIN_DEFAULTS: Final[dict[str, tuple[str, ...]]] = {
    "mesh": ("1x1",),
    "dtype": ("fp64",),
    "autocast": ("off",),
    "path": ("reference",),
}
_BACKENDS: Final = ("gloo", "nccl")
_DEVICES: Final = ("cpu", "cuda")
_CASE_RE: Final = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*\Z")
_ENV_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


class _Ctx:
    """Where we are in the file: turns a node into a located error."""

    def __init__(self, file: str, loader: yaml.SafeLoader) -> None:
        self.file = file
        self.loader = loader
        #: (YAML path of a mesh list, mesh text) -> its node, for located rank-limit errors.
        self.mesh_nodes: dict[tuple[str, str], tuple[yaml.Node, str]] = {}

    def error(
        self, node: yaml.Node, path: str, message: str, allowed: str = ""
    ) -> SpecError:
        mark = node.start_mark
        return SpecError(self.file, mark.line + 1, mark.column + 1, path, message, allowed)

    def scalar(self, node: yaml.Node, path: str) -> Scalar:
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(node, path, f"expected a scalar, got a {_kind(node)}")
        try:
            value = self.loader.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError) as exc:
            # An explicit tag the safe loader refuses (!!python/...) or cannot apply
            # (!!int abc) fails here, long after composing succeeded.
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise self.error(node, path, f"cannot read {node.value!r}: {problem}") from None
        if value is None or not isinstance(value, str | int | float | bool):
            raise self.error(
                node, path, f"expected a string, number or boolean, got {value!r}"
            )
        return value

    def string(self, node: yaml.Node, path: str) -> str:
        value = self.scalar(node, path)
        if not isinstance(value, str):
            raise self.error(node, path, f"expected a string, got {value!r}")
        return value

    def mapping(
        self, node: yaml.Node, path: str, allowed: tuple[str, ...] | None
    ) -> Iterator[tuple[str, yaml.Node, yaml.Node]]:
        """Yield (key, key_node, value_node); reject duplicates and unknown keys."""
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, path, f"expected a mapping, got a {_kind(node)}")
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = self.scalar(key_node, path)
            key = _render(key) if not isinstance(key, str) else key
            sub = f"{path}.{key}" if path else key
            if key in seen:
                raise self.error(key_node, sub, f"duplicate key {key!r}")
            seen.add(key)
            if allowed is not None and key not in allowed:
                raise self.error(
                    key_node, sub, f"unknown key {key!r}", ", ".join(allowed)
                )
            yield key, key_node, value_node

    def sequence(self, node: yaml.Node, path: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.error(node, path, f"expected a list, got a {_kind(node)}")
        return list(node.value)

    def scalar_list(self, node: yaml.Node, path: str) -> list[tuple[Scalar, yaml.Node, str]]:
        """A list of scalars (a lone scalar counts as a one-element list)."""
        if isinstance(node, yaml.ScalarNode):
            return [(self.scalar(node, path), node, path)]
        items = self.sequence(node, path)
        if not items:
            raise self.error(node, path, "empty list: give at least one value")
        out = []
        for i, item in enumerate(items):
            out.append((self.scalar(item, f"{path}[{i}]"), item, f"{path}[{i}]"))
        return out


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "mapping"
    if isinstance(node, yaml.SequenceNode):
        return "list"
    return "scalar"


def _render(value: Scalar) -> str:
    """How a scalar appears in ids and comparisons (YAML's on/off read as booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _axis_value(ctx: _Ctx, axis: str, value: Scalar, node: yaml.Node, path: str) -> str:
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
    vocab = {"level": LEVELS, "dtype": DTYPES, "path": PATHS}[axis]
    if value not in vocab:
        raise ctx.error(node, path, f"unknown {axis} {value!r}", ", ".join(vocab))
    return value


def _axis_list(ctx: _Ctx, axis: str, node: yaml.Node, path: str) -> tuple[str, ...]:
    values: list[str] = []
    for value, item, ipath in ctx.scalar_list(node, path):
        text = _axis_value(ctx, axis, value, item, ipath)
        if text in values:
            raise ctx.error(item, ipath, f"duplicate {axis} value {text!r}")
        values.append(text)
        if axis == "mesh":
            ctx.mesh_nodes[(path, text)] = (item, ipath)
    return tuple(values)


def _where(ctx: _Ctx, node: yaml.Node) -> str:
    return f"{ctx.file}:{node.start_mark.line + 1}"


def _platform(ctx: _Ctx, name: str, node: yaml.Node, path: str) -> Platform:
    fields: dict[str, yaml.Node] = {}
    for key, _, value_node in ctx.mapping(node, path, ALLOWED_KEYS["platform"]):
        fields[key] = value_node
    for required in ("backend", "device"):  # image: only the docker runner needs one
        if required not in fields:
            raise ctx.error(node, path, f"platform {name!r} needs {required!r}")
    backend = ctx.string(fields["backend"], f"{path}.backend")
    if backend not in _BACKENDS:
        raise ctx.error(
            fields["backend"], f"{path}.backend", f"unknown backend {backend!r}",
            ", ".join(_BACKENDS),
        )
    device = ctx.string(fields["device"], f"{path}.device")
    if device not in _DEVICES:
        raise ctx.error(
            fields["device"], f"{path}.device", f"unknown device {device!r}", ", ".join(_DEVICES)
        )
    env: list[tuple[str, str]] = []
    if "env" in fields:
        for key, key_node, value_node in ctx.mapping(fields["env"], f"{path}.env", None):
            if not _ENV_RE.match(key):
                raise ctx.error(key_node, f"{path}.env.{key}", f"bad variable name {key!r}")
            env.append((key, _render(ctx.scalar(value_node, f"{path}.env.{key}"))))
    description = ""
    if "description" in fields:
        description = ctx.string(fields["description"], f"{path}.description")
    max_ranks = MAX_RANKS
    if "max_ranks" in fields:
        max_ranks = _positive_int(ctx, fields["max_ranks"], f"{path}.max_ranks")
    return Platform(
        name=name,
        backend=backend,  # type: ignore[arg-type]  # checked against _BACKENDS above
        device=device,  # type: ignore[arg-type]
        image=ctx.string(fields["image"], f"{path}.image") if "image" in fields else None,
        where=_where(ctx, node),
        env=tuple(env),
        description=description,
        max_ranks=max_ranks,
    )


def _positive_int(ctx: _Ctx, node: yaml.Node, path: str) -> int:
    value = ctx.scalar(node, path)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ctx.error(node, path, f"expected a positive integer, got {value!r}")
    return value


def _timeout(ctx: _Ctx, node: yaml.Node, path: str) -> int:
    value = ctx.scalar(node, path)
    if isinstance(value, str) and value in TIMEOUT_CLASSES:
        return timeout_seconds(value)
    allowed = ", ".join(f"{k} ({v} s)" for k, v in TIMEOUT_CLASSES.items())
    allowed += f", or seconds in (0, {MAX_TIMEOUT_S}]"
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and value > 0
        and (isinstance(value, int) or math.isfinite(value))
    ):
        if value > MAX_TIMEOUT_S:
            shown = repr(value) if len(repr(value)) < 24 else f"{repr(value)[:12]}..."
            raise ctx.error(node, path, f"timeout {shown} s is above the limit of "
                            f"{MAX_TIMEOUT_S} s (one day)", allowed)
        return timeout_seconds(value)
    raise ctx.error(
        node, path, f"bad timeout {value!r}: neither a class nor a positive number of seconds",
        allowed,
    )


def _target(
    ctx: _Ctx,
    node: yaml.Node,
    path: str,
    defaults: dict[str, tuple[str, ...]],
    platforms: tuple[str, ...],
) -> Target:
    fields: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for key, key_node, value_node in ctx.mapping(node, path, ALLOWED_KEYS["target"]):
        fields[key] = (key_node, value_node)
    for required in ("name", "case", "level"):
        if required not in fields:
            raise ctx.error(node, path, f"target needs {required!r}")
    name_node = fields["name"][1]
    name = ctx.string(name_node, f"{path}.name")
    if not NAME_RE.match(name):
        raise ctx.error(
            name_node, f"{path}.name", f"bad target name {name!r}", "letters, digits and _"
        )
    case_node = fields["case"][1]
    case = ctx.string(case_node, f"{path}.case")
    if not _CASE_RE.match(case):
        raise ctx.error(
            case_node,
            f"{path}.case",
            f"bad case {case!r}: must be 'module:function'",
            "e.g. mypkg.tests.cases:ring_attention",
        )
    level_node = fields["level"][1]
    level = _axis_value(ctx, "level", ctx.scalar(level_node, f"{path}.level"), level_node,
                        f"{path}.level")
    kind = "parity"
    if "kind" in fields:
        kind_node = fields["kind"][1]
        kind = ctx.string(kind_node, f"{path}.kind")
        if kind not in KINDS:
            raise ctx.error(kind_node, f"{path}.kind", f"unknown kind {kind!r}", ", ".join(KINDS))
    tags: list[str] = []
    if "tags" in fields:
        for value, item, ipath in ctx.scalar_list(fields["tags"][1], f"{path}.tags"):
            if not isinstance(value, str) or not NAME_RE.match(value):
                raise ctx.error(item, ipath, f"bad tag {value!r}", "letters, digits and _")
            tags.append(value)
    timeout_s = 300
    if "timeout" in fields:
        timeout_s = _timeout(ctx, fields["timeout"][1], f"{path}.timeout")
    target_platforms: list[str] = []
    if "platforms" in fields:
        for value, item, ipath in ctx.scalar_list(fields["platforms"][1], f"{path}.platforms"):
            if value not in platforms:
                raise ctx.error(item, ipath, f"unknown platform {value!r}", ", ".join(platforms))
            if value in target_platforms:
                raise ctx.error(item, ipath, f"duplicate platform {value!r}")
            target_platforms.append(str(value))
    axes = dict(defaults)
    if "axes" in fields:
        apath = f"{path}.axes"
        allowed_axes = ALLOWED_KEYS["target.axes"]
        for key, _, value_node in ctx.mapping(fields["axes"][1], apath, allowed_axes):
            axes[key] = _axis_list(ctx, key, value_node, f"{apath}.{key}")
    params: list[tuple[str, tuple[Scalar, ...]]] = []
    if "params" in fields:
        ppath = f"{path}.params"
        for key, key_node, value_node in ctx.mapping(fields["params"][1], ppath, None):
            kpath = f"{ppath}.{key}"
            if not NAME_RE.match(key) or key in ALLOWED_KEYS["clause"]:
                raise ctx.error(
                    key_node, kpath, f"bad extra-axis name {key!r}",
                    "letters, digits and _, not a standard axis, 'target' or 'platform'",
                )
            values: list[Scalar] = []
            rendered: list[str] = []
            for value, item, ipath in ctx.scalar_list(value_node, kpath):
                text = _render(value)
                if not VALUE_RE.match(text):
                    raise ctx.error(
                        item, ipath, f"value {value!r} cannot appear in a cell id",
                        "letters, digits, '_', '.', '+' and '-'",
                    )
                if text in rendered:
                    raise ctx.error(item, ipath, f"duplicate value {value!r} (as {text!r})")
                values.append(value)
                rendered.append(text)
            params.append((key, tuple(values)))
    description = ""
    if "description" in fields:
        description = ctx.string(fields["description"][1], f"{path}.description")
    spill: SpillBlock | None = None
    if kind == "spill":
        if "spill" not in fields:
            raise ctx.error(node, path, "a kind: spill target needs a 'spill' block",
                            ", ".join(ALLOWED_KEYS["target.spill"]))
        for key in ("axes", "params"):
            if key in fields:
                raise ctx.error(fields[key][0], f"{path}.{key}",
                                f"a spill target takes no {key!r}: its cells are one per "
                                "(config, arch) of its 'spill' block")
        spill = _spill_block(ctx, fields["spill"][1], f"{path}.spill")
        axes = {"mesh": ("1x1",), "dtype": ("fp32",), "autocast": ("off",),
                "path": ("kernel",)}
        params = [("config", tuple(name for name, _ in spill.configs)),
                  ("arch", spill.archs)]
    elif "spill" in fields:
        raise ctx.error(fields["spill"][0], f"{path}.spill",
                        "a 'spill' block needs kind: spill")
    return Target(
        name=name,
        case=case,
        level=level,
        kind=kind,
        tags=tuple(tags),
        timeout_s=timeout_s,
        platforms=tuple(target_platforms),
        axes=tuple((k, axes[k]) for k in ("mesh", "dtype", "autocast", "path")),
        params=tuple(params),
        description=description,
        where=_where(ctx, node),
        case_at=(case_node.start_mark.line + 1, case_node.start_mark.column + 1),
        spill=spill,
    )


def _spill_block(ctx: _Ctx, node: yaml.Node, path: str) -> SpillBlock:
    """The ``spill:`` block of a ``kind: spill`` target."""
    from cpmatrix.spill._spec import ARCHS  # stdlib-only module: no torch, no triton

    values: dict[str, object] = {}
    nodes: dict[str, yaml.Node] = {}
    for key, _, value_node in ctx.mapping(node, path, ALLOWED_KEYS["target.spill"]):
        nodes[key] = value_node
    if "signature" in nodes:
        sig: list[tuple[str, str]] = []
        for name, key_node, value_node in ctx.mapping(nodes["signature"], f"{path}.signature",
                                                      None):
            if not _ENV_RE.match(name):
                raise ctx.error(key_node, f"{path}.signature.{name}",
                                f"bad parameter name {name!r}")
            sig.append((name, ctx.string(value_node, f"{path}.signature.{name}")))
        values["signature"] = tuple(sig)
    if "table" in nodes:
        values["table"] = ctx.string(nodes["table"], f"{path}.table")
        if not _ENV_RE.match(str(values["table"])):
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


def _same_scalar(a: Scalar, b: Scalar) -> bool:
    """Equal values of the same type (``7`` and ``"7"`` render alike but differ)."""
    return type(a) is type(b) and a == b


def _clause(
    ctx: _Ctx,
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
            raise ctx.error(key_node, kpath, f"unknown key {key!r}", ", ".join(allowed))
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
            elif key in ("level", "mesh", "dtype", "autocast", "path"):
                values.append(_axis_value(ctx, key, value, item, ipath))
                if key == "mesh":
                    ctx.mesh_nodes[(kpath, str(values[-1]))] = (item, ipath)
            else:
                text = _render(value)
                known = sorted({_render(v) for v in declared[key]})
                # An exclude naming a value no target has would silently match nothing;
                # an include may add new values, but not ones that only look like old ones.
                if not is_include and text not in known:
                    raise ctx.error(
                        item, ipath, f"unknown value {value!r} for extra axis {key!r}",
                        ", ".join(known),
                    )
                if not VALUE_RE.match(text):
                    raise ctx.error(
                        item, ipath, f"value {value!r} cannot appear in a cell id",
                        "letters, digits, '_', '.', '+' and '-'",
                    )
                # Excludes compare rendered text, so only an include can make a twin.
                clash = next(
                    (v for v in declared[key] if _render(v) == text and not _same_scalar(v, value)),
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
                values.append(value)
        conditions.append((key, tuple(values)))
    if not conditions:
        raise ctx.error(node, path, "empty clause: name at least one axis")
    return Clause(conditions=tuple(conditions), where=_where(ctx, node), label=label)


def parse_matrix(text: str, file: str = "<matrix>", base_dir: str | None = None) -> Matrix:
    """Parse matrix YAML text; raise :class:`SpecError` on any problem."""
    loader = yaml.SafeLoader(text)
    try:
        try:
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark else 1
            col = mark.column + 1 if mark else 1
            problem = exc.problem or "malformed YAML"
            if exc.context and problem.startswith("but "):
                # e.g. "expected a single document in the stream, but found another document"
                problem = f"{exc.context}, {problem}"
            elif exc.context:
                problem = f"{problem} ({exc.context})"
            raise SpecError(file, line, col, "", f"YAML syntax error: {problem}") from None
        except yaml.YAMLError as exc:
            raise SpecError(file, 1, 1, "", f"YAML error: {exc}") from None
        except RecursionError:
            # PyYAML composes recursively; thousands of nested brackets exhaust the stack.
            raise SpecError(file, 1, 1, "", "YAML nested too deeply to be a matrix") from None
        if root is None:
            raise SpecError(file, 1, 1, "", "empty matrix file", "a mapping with 'version: 1'")
        ctx = _Ctx(file, loader)
        return _matrix(ctx, root, base_dir if base_dir is not None else os.path.dirname(file))
    finally:
        loader.dispose()


def _matrix(ctx: _Ctx, root: yaml.Node, base_dir: str) -> Matrix:
    sections: dict[str, yaml.Node] = {}
    for key, _, value_node in ctx.mapping(root, "", ALLOWED_KEYS["matrix"]):
        sections[key] = value_node
    if "version" not in sections:
        raise ctx.error(root, "", "missing 'version'", "1")
    version = ctx.scalar(sections["version"], "version")
    if version != 1 or isinstance(version, bool):
        raise ctx.error(sections["version"], "version", f"unsupported version {version!r}", "1")
    if "platforms" not in sections:
        raise ctx.error(root, "", "missing 'platforms'", "a mapping such as {cpu: {...}}")
    platforms = tuple(
        _platform(ctx, name, node, f"platforms.{name}")
        for name, _, node in ctx.mapping(sections["platforms"], "platforms", None)
    )
    for p, (_, key_node, _) in zip(
        platforms, ctx.mapping(sections["platforms"], "platforms", None), strict=True
    ):
        if not NAME_RE.match(p.name):
            raise ctx.error(key_node, f"platforms.{p.name}", f"bad platform name {p.name!r}")
    if not platforms:
        raise ctx.error(sections["platforms"], "platforms", "no platform declared")
    platform_names = tuple(p.name for p in platforms)

    defaults = dict(_BUILTIN_DEFAULTS)
    if "defaults" in sections:
        for key, _, value_node in ctx.mapping(
            sections["defaults"], "defaults", ALLOWED_KEYS["defaults"]
        ):
            defaults[key] = _axis_list(ctx, key, value_node, f"defaults.{key}")

    if "targets" not in sections:
        raise ctx.error(root, "", "missing 'targets'", "a list of targets")
    targets: list[Target] = []
    names: dict[str, int] = {}
    for i, node in enumerate(ctx.sequence(sections["targets"], "targets")):
        t = _target(ctx, node, f"targets[{i}]", defaults, platform_names)
        if t.name in names:
            name_node = _child(node, "name")
            raise ctx.error(
                name_node or node,
                f"targets[{i}].name",
                f"duplicate target name {t.name!r} (first at targets[{names[t.name]}])",
            )
        names[t.name] = i
        targets.append(t)
    if not targets:
        raise ctx.error(sections["targets"], "targets", "no target declared")

    clauses: dict[str, list[Clause]] = {"exclude": [], "include": []}
    for section in ("exclude", "include"):
        if section in sections:
            for i, node in enumerate(ctx.sequence(sections[section], section)):
                clauses[section].append(
                    _clause(ctx, node, f"{section}[{i}]", f"{section}[{i}]", tuple(targets),
                            platform_names, section == "include")
                )

    max_cells = MAX_CELLS
    if "max_cells" in sections:
        max_cells = _positive_int(ctx, sections["max_cells"], "max_cells")
    _check_ranks(ctx, platforms, targets, clauses["include"], sections)
    _check_size(ctx, platforms, targets, clauses["include"], max_cells, sections)

    pythonpath: list[str] = []
    if "pythonpath" in sections:
        for value, item, ipath in ctx.scalar_list(sections["pythonpath"], "pythonpath"):
            if not isinstance(value, str):
                raise ctx.error(item, ipath, f"expected a directory, got {value!r}")
            directory = Path(base_dir, value).resolve()
            if not directory.is_dir():
                raise ctx.error(item, ipath, f"no such directory {str(directory)!r}")
            pythonpath.append(str(directory))

    return Matrix(
        path=ctx.file,
        version=1,
        platforms=platforms,
        targets=tuple(targets),
        exclude=tuple(clauses["exclude"]),
        include=tuple(clauses["include"]),
        pythonpath=tuple(pythonpath),
        max_cells=max_cells,
    )


def _target_platforms(target: Target, platforms: tuple[Platform, ...]) -> list[Platform]:
    return [p for p in platforms if not target.platforms or p.name in target.platforms]


def _check_ranks(ctx: _Ctx, platforms: tuple[Platform, ...], targets: list[Target],
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


def _check_size(ctx: _Ctx, platforms: tuple[Platform, ...], targets: list[Target],
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


def _child(node: yaml.Node, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key and isinstance(v, yaml.Node):
                return v
    return None


def load_matrix(path: str | os.PathLike[str]) -> Matrix:
    """Read and validate a matrix file.

    Raises :class:`SpecError` (exit 2) for anything malformed, including a missing file.
    """
    file = os.fspath(path)
    return parse_matrix(read_spec_text(file, "matrix"), file)


def reject_duplicate_keys(file: str, root: yaml.Node | None) -> None:
    """Raise :class:`SpecError` at the second of two equal keys in any mapping of ``root``.

    PyYAML keeps the last of duplicate keys silently; every spec file cpmatrix reads
    (matrices, gates) refuses them instead, so no setting is overridden by accident.
    """
    stack = [(root, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key_node, value_node in node.value:
                key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
                sub = f"{path}.{key}" if path else key
                if key in seen:
                    mark = key_node.start_mark
                    raise SpecError(file, mark.line + 1, mark.column + 1, sub,
                                    f"duplicate key {key!r}")
                seen.add(key)
                stack.append((value_node, sub))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(node.value))


def read_spec_text(file: str, what: str) -> str:
    """The text of a YAML spec file, or a :class:`SpecError` naming it (exit 2)."""
    try:
        return Path(file).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(file, 0, 0, "", f"no such {what} file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(file, 0, 0, "", f"cannot read {what}: {exc}") from None
