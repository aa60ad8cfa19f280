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
from pathlib import Path
from typing import Final

import yaml

from cpmatrix.defaults import TIMEOUT_S
from cpmatrix.errors import SpecError
from cpmatrix.matrix.axes import axis_list, axis_value, extra_value_text, where_of
from cpmatrix.matrix.clauses import clause
from cpmatrix.matrix.limits import check_ranks, check_size
from cpmatrix.matrix.pytest_paths import pytest_paths
from cpmatrix.matrix.schema import (
    ALLOWED_KEYS,
    ENV_NAME_RE,
    IMAGE_FORMS,
    KINDS,
    MAX_CELLS,
    MAX_RANKS,
    MAX_TIMEOUT_S,
    NAME_RE,
    PYTEST_CASE,
    TARGET_AXES,
    TIMEOUT_CLASSES,
    Clause,
    Matrix,
    Platform,
    RemoteCacheSetting,
    Scalar,
    SpillBlock,
    Target,
    image_form,
    timeout_seconds,
)
from cpmatrix.matrix.spill_block import spill_block
from cpmatrix.matrix.yamlreader import (
    SpecReader,
    compose,
    read_spec_text,
    reject_duplicate_keys,
    render,
)

__all__ = [
    "ALLOWED_KEYS",
    "NAME_A_MATRIX",
    "load_matrix",
    "parse_matrix",
    "read_spec_text",
    "reject_duplicate_keys",
]

#: How to name a matrix, said wherever none is named or the named one is missing.
NAME_A_MATRIX: Final = ("give --matrix FILE, or set matrix = \"FILE\" in [tool.cpmatrix] of "
                        "your pyproject.toml (`cpmatrix init` writes a starter project)")

_BUILTIN_DEFAULTS: Final[dict[str, tuple[str, ...]]] = {
    "mesh": ("1x1",),
    "dtype": ("fp64",),
    "autocast": ("off",),
    "path": ("reference",),
}
_BACKENDS: Final = ("gloo", "nccl")
_DEVICES: Final = ("cpu", "cuda")
_CASE_RE: Final = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*\Z")


def _platform(ctx: SpecReader, name: str, node: yaml.Node, path: str) -> Platform:
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
            if not ENV_NAME_RE.match(key):
                raise ctx.error(key_node, f"{path}.env.{key}", f"bad variable name {key!r}")
            env.append((key, render(ctx.scalar(value_node, f"{path}.env.{key}"))))
    description = ""
    if "description" in fields:
        description = ctx.string(fields["description"], f"{path}.description")
    max_ranks = MAX_RANKS
    if "max_ranks" in fields:
        max_ranks = _positive_int(ctx, fields["max_ranks"], f"{path}.max_ranks")
    image = None
    if "image" in fields:
        image = ctx.string(fields["image"], f"{path}.image")
        if image_form(image) is None:
            raise ctx.error(fields["image"], f"{path}.image",
                            f"{image!r} is neither a Dockerfile nor an image reference",
                            IMAGE_FORMS)
    return Platform(
        name=name,
        backend=backend,  # type: ignore[arg-type]  # checked against _BACKENDS above
        device=device,  # type: ignore[arg-type]
        image=image,
        where=where_of(ctx, node),
        env=tuple(env),
        description=description,
        max_ranks=max_ranks,
    )


def _positive_int(ctx: SpecReader, node: yaml.Node, path: str) -> int:
    value = ctx.scalar(node, path)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ctx.error(node, path, f"expected a positive integer, got {value!r}")
    return value


def _timeout(ctx: SpecReader, node: yaml.Node, path: str) -> int:
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
    ctx: SpecReader,
    node: yaml.Node,
    path: str,
    defaults: dict[str, tuple[str, ...]],
    platforms: tuple[str, ...],
    base_dir: str = ".",
) -> Target:
    fields: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for key, key_node, value_node in ctx.mapping(node, path, ALLOWED_KEYS["target"]):
        fields[key] = (key_node, value_node)
    pytest: tuple[str, ...] = ()
    if "pytest" in fields:
        # A pytest target: its tests are the cells; the case is the front's in-rank runner.
        pytest = _pytest_fields(ctx, node, path, fields, base_dir)
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
    level = axis_value(ctx, "level", ctx.scalar(level_node, f"{path}.level"), level_node,
                        f"{path}.level")
    kind = _kind(ctx, fields, path, pytest)
    tags = _tags(ctx, fields, path)
    timeout_s = TIMEOUT_S
    if "timeout" in fields:
        timeout_s = _timeout(ctx, fields["timeout"][1], f"{path}.timeout")
    target_platforms = _platforms_of_target(ctx, fields, path, platforms)
    axes = dict(defaults)
    if "axes" in fields:
        apath = f"{path}.axes"
        allowed_axes = ALLOWED_KEYS["target.axes"]
        for key, _, value_node in ctx.mapping(fields["axes"][1], apath, allowed_axes):
            axes[key] = axis_list(ctx, key, value_node, f"{apath}.{key}")
    params: list[tuple[str, tuple[Scalar, ...]]] = []
    if "params" in fields:
        params = _extra_axes(ctx, fields["params"][1], f"{path}.params")
    description = ""
    if "description" in fields:
        description = ctx.string(fields["description"][1], f"{path}.description")
    spill = _spill_of_target(ctx, node, path, fields, kind)
    if spill is not None:
        # A spill target's cells are one per (config, arch) of its block.
        axes = {"mesh": ("1x1",), "dtype": ("fp32",), "autocast": ("off",),
                "path": ("kernel",)}
        params = [("config", tuple(name for name, _ in spill.configs)),
                  ("arch", spill.archs)]
    if pytest:
        # One cell per collected test and world: the mesh comes from each test.
        axes = dict(_BUILTIN_DEFAULTS)
    return Target(
        name=name,
        case=case,
        level=level,
        kind=kind,
        tags=tuple(tags),
        timeout_s=timeout_s,
        platforms=tuple(target_platforms),
        axes=tuple((k, axes[k]) for k in TARGET_AXES),
        params=tuple(params),
        description=description,
        where=where_of(ctx, node),
        case_at=(case_node.start_mark.line + 1, case_node.start_mark.column + 1),
        spill=spill,
        pytest=pytest,
    )


def _kind(ctx: SpecReader, fields: dict[str, tuple[yaml.Node, yaml.Node]], path: str,
          pytest: tuple[str, ...]) -> str:
    """The target's ``kind``: given and known, or ``pytest``/``parity`` by its keys."""
    kind = "pytest" if pytest else "parity"
    if "kind" in fields:
        kind_node = fields["kind"][1]
        kind = ctx.string(kind_node, f"{path}.kind")
        if kind not in KINDS:
            raise ctx.error(kind_node, f"{path}.kind", f"unknown kind {kind!r}", ", ".join(KINDS))
        if kind == "pytest" and not pytest:
            raise ctx.error(kind_node, f"{path}.kind", "a kind: pytest target names its tests "
                            "with 'pytest:' (a file, folder or node id), not 'case:'")
    return kind


def _tags(ctx: SpecReader, fields: dict[str, tuple[yaml.Node, yaml.Node]],
          path: str) -> list[str]:
    """The target's ``tags``: names (letters, digits and ``_``)."""
    tags: list[str] = []
    if "tags" in fields:
        for value, item, ipath in ctx.scalar_list(fields["tags"][1], f"{path}.tags"):
            if not isinstance(value, str) or not NAME_RE.match(value):
                raise ctx.error(item, ipath, f"bad tag {value!r}", "letters, digits and _")
            tags.append(value)
    return tags


def _platforms_of_target(ctx: SpecReader, fields: dict[str, tuple[yaml.Node, yaml.Node]],
                         path: str, platforms: tuple[str, ...]) -> list[str]:
    """The target's ``platforms``: declared ones, each once (empty: every platform)."""
    target_platforms: list[str] = []
    if "platforms" in fields:
        for value, item, ipath in ctx.scalar_list(fields["platforms"][1], f"{path}.platforms"):
            if value not in platforms:
                raise ctx.error(item, ipath, f"unknown platform {value!r}", ", ".join(platforms))
            if value in target_platforms:
                raise ctx.error(item, ipath, f"duplicate platform {value!r}")
            target_platforms.append(str(value))
    return target_platforms


def _extra_axes(ctx: SpecReader, node: yaml.Node,
                ppath: str) -> list[tuple[str, tuple[Scalar, ...]]]:
    """The target's ``params`` (its extra axes): each name and its values, which must
    fit in a cell id and differ as text."""
    params: list[tuple[str, tuple[Scalar, ...]]] = []
    for key, key_node, value_node in ctx.mapping(node, ppath, None):
        kpath = f"{ppath}.{key}"
        if not NAME_RE.match(key) or key in ALLOWED_KEYS["clause"]:
            raise ctx.error(
                key_node, kpath, f"bad extra-axis name {key!r}",
                "letters, digits and _, not a standard axis, 'target' or 'platform'",
            )
        values: list[Scalar] = []
        rendered: list[str] = []
        for value, item, ipath in ctx.scalar_list(value_node, kpath):
            text = extra_value_text(ctx, value, item, ipath)
            if text in rendered:
                raise ctx.error(item, ipath, f"duplicate value {value!r} (as {text!r})")
            values.append(value)
            rendered.append(text)
        params.append((key, tuple(values)))
    return params


def _spill_of_target(ctx: SpecReader, node: yaml.Node, path: str,
                     fields: dict[str, tuple[yaml.Node, yaml.Node]],
                     kind: str) -> SpillBlock | None:
    """A ``kind: spill`` target's ``spill`` block (it takes no axes or params); None for
    any other kind, which may not have one."""
    if kind == "spill":
        if "spill" not in fields:
            raise ctx.error(node, path, "a kind: spill target needs a 'spill' block",
                            ", ".join(ALLOWED_KEYS["target.spill"]))
        for key in ("axes", "params"):
            if key in fields:
                raise ctx.error(fields[key][0], f"{path}.{key}",
                                f"a spill target takes no {key!r}: its cells are one per "
                                "(config, arch) of its 'spill' block")
        return spill_block(ctx, fields["spill"][1], f"{path}.spill")
    if "spill" in fields:
        raise ctx.error(fields["spill"][0], f"{path}.spill",
                        "a 'spill' block needs kind: spill")
    return None


def _pytest_fields(ctx: SpecReader, node: yaml.Node, path: str,
                   fields: dict[str, tuple[yaml.Node, yaml.Node]],
                   base_dir: str) -> tuple[str, ...]:
    """Check a ``pytest:`` target's keys and read its paths; fills in its ``case`` (the
    front's runner) and ``level`` (``unit`` unless given)."""
    for key in ("case", "axes", "params", "spill"):
        if key in fields:
            raise ctx.error(fields[key][0], f"{path}.{key}",
                            f"a pytest target takes no {key!r}: its cells are its collected "
                            "tests, each in the world it asks for",
                            "name, pytest, level, tags, timeout, platforms, description")
    if "kind" in fields and ctx.scalar(fields["kind"][1], f"{path}.kind") != "pytest":
        raise ctx.error(fields["kind"][1], f"{path}.kind",
                        "a target with 'pytest:' is of kind pytest", "pytest")
    value_node = fields["pytest"][1]
    paths = pytest_paths(ctx, value_node, f"{path}.pytest", base_dir)
    fields["case"] = (fields["pytest"][0], yaml.ScalarNode(
        "tag:yaml.org,2002:str", PYTEST_CASE, value_node.start_mark, value_node.end_mark))
    if "level" not in fields:
        fields["level"] = (fields["pytest"][0], yaml.ScalarNode(
            "tag:yaml.org,2002:str", "unit", value_node.start_mark, value_node.end_mark))
    return paths


def parse_matrix(text: str, file: str = "<matrix>", base_dir: str | None = None) -> Matrix:
    """Parse matrix YAML text; raise :class:`SpecError` on any problem."""
    ctx, root = compose(text, file)
    try:
        return _matrix(ctx, root, base_dir if base_dir is not None else os.path.dirname(file))
    finally:
        ctx.loader.dispose()


def _matrix(ctx: SpecReader, root: yaml.Node, base_dir: str) -> Matrix:
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
            defaults[key] = axis_list(ctx, key, value_node, f"defaults.{key}")

    if "targets" not in sections:
        raise ctx.error(root, "", "missing 'targets'", "a list of targets")
    targets: list[Target] = []
    names: dict[str, int] = {}
    for i, node in enumerate(ctx.sequence(sections["targets"], "targets")):
        t = _target(ctx, node, f"targets[{i}]", defaults, platform_names, base_dir)
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
                    clause(ctx, node, f"{section}[{i}]", f"{section}[{i}]", tuple(targets),
                            platform_names, section == "include")
                )

    max_cells = MAX_CELLS
    if "max_cells" in sections:
        max_cells = _positive_int(ctx, sections["max_cells"], "max_cells")
    check_ranks(ctx, platforms, targets, clauses["include"], sections)
    check_size(ctx, platforms, targets, clauses["include"], max_cells, sections)

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
        remote_cache=_remote_cache(ctx, sections["remote_cache"])
        if "remote_cache" in sections else None,
    )


def _remote_cache(ctx: SpecReader, node: yaml.Node) -> RemoteCacheSetting:
    """``remote_cache: URL`` or ``remote_cache: {url: URL, read_only: BOOL}``."""
    read_only = False
    url_node = node
    if isinstance(node, yaml.MappingNode):
        fields = {k: v for k, _, v in ctx.mapping(node, "remote_cache",
                                                 ALLOWED_KEYS["remote_cache"])}
        if "url" not in fields:
            raise ctx.error(node, "remote_cache", "missing 'url'",
                            "http(s)://host[:port][/prefix]")
        url_node = fields["url"]
        if "read_only" in fields:
            read_only = ctx.flag(fields["read_only"], "remote_cache.read_only")
    path = "remote_cache.url" if url_node is not node else "remote_cache"
    url = ctx.string(url_node, path)
    mark = url_node.start_mark
    return RemoteCacheSetting(url=url, read_only=read_only, file=ctx.file,
                              line=mark.line + 1, column=mark.column + 1)


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
    try:
        text = read_spec_text(file, "matrix")
    except SpecError as exc:
        if not os.path.exists(file):  # say how to name another one
            raise SpecError(file, 0, 0, "", exc.message, hint=NAME_A_MATRIX) from None
        raise
    return parse_matrix(text, file)
