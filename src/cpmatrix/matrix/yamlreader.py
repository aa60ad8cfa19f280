"""The one YAML reader of cpmatrix's spec files (matrices, gates.yaml).

Files are composed into PyYAML nodes with the safe loader only, so every value keeps its
line and column; :class:`SpecReader` turns nodes into typed values or a located
:class:`~cpmatrix.errors.SpecError` (file:line:column, YAML path, bad value, what is
allowed). Duplicate keys are refused everywhere (PyYAML would keep the last silently).

Example::

    >>> reader, root = compose("version: 1\nname: x\n", "m.yaml")
    >>> [(k, reader.scalar(v, k)) for k, _, v in reader.mapping(root, "", ("version", "name"))]
    [('version', 1), ('name', 'x')]
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import yaml

from cpmatrix.errors import SpecError
from cpmatrix.matrix.schema import Scalar
from cpmatrix.suggest import suggestion

__all__ = ["SpecReader", "compose", "kind_of", "read_spec_text", "reject_duplicate_keys",
           "render", "yaml_problem_in_words"]


#: PyYAML's problems, as a person would say them (PyYAML's own words in parentheses).
_PROBLEMS: tuple[tuple[str, str], ...] = (
    ("expected <block end>, but found '<block mapping start>'",
     "this line's indentation matches no block above it (the keys of one mapping start "
     "in the same column)"),
    ("expected <block end>, but found '?'",
     "this key is not in line with the list above it (a '- ' item and a key cannot "
     "share a block)"),
    ("expected <block end>", "this line's indentation does not fit its block"),
    ("mapping values are not allowed here",
     "a ':' where no key can start: a line indented more than its block, or a value "
     "holding ': ' (quote it)"),
    ("found character '\\t' that cannot start any token",
     "a tab: YAML indents with spaces only"),
    ("could not find expected ':'", "a key without its ':' (or a line indented wrongly)"),
    ("expected ',' or ']'", "expected a ']' to close the '[' list (or a ',' between its "
     "items)"),
    ("expected ',' or '}'", "expected a '}' to close the '{' mapping (or a ',' between its "
     "entries)"),
    ("found unexpected end of stream", "a quote that is never closed"),
    ("found undefined alias", "a '*name' alias with no '&name' anchor before it "
     "(quote a value that starts with '*')"),
    ("but found another document", "a second document ('---'): a spec file holds one"),
)


def yaml_problem_in_words(exc: yaml.MarkedYAMLError) -> str:
    """What is wrong, in words, for a syntax error PyYAML reports in its own terms.

    >>> try:
    ...     yaml.SafeLoader("a:\\n  b: 1\\n c: 2\\n").get_single_node()
    ... except yaml.MarkedYAMLError as exc:
    ...     print(yaml_problem_in_words(exc))  # doctest: +ELLIPSIS
    this line's indentation matches no block above it (the keys of one mapping ...)
    """
    problem = exc.problem or "malformed YAML"
    raw = f"{exc.context}, {problem}" if exc.context and problem.startswith("but ") else problem
    for pattern, words in _PROBLEMS:
        if pattern in raw:
            return f"{words} ({raw})"
    return f"{raw} ({exc.context})" if exc.context and raw == problem else raw


def compose(text: str, file: str, what: str = "matrix") -> tuple[SpecReader, yaml.Node]:
    """The reader and root node of ``text``; SpecError for bad YAML or an empty file.

    Call ``reader.loader.dispose()`` when done (or let it be collected).
    """
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        col = mark.column + 1 if mark else 1
        raise SpecError(file, line, col, "",
                        f"YAML syntax error: {yaml_problem_in_words(exc)}") from None
    except yaml.YAMLError as exc:
        raise SpecError(file, 1, 1, "", f"YAML error: {exc}") from None
    except RecursionError:
        # PyYAML composes recursively; thousands of nested brackets exhaust the stack.
        raise SpecError(file, 1, 1, "", f"YAML nested too deeply to be a {what}") from None
    if root is None:
        raise SpecError(file, 1, 1, "", f"empty {what} file", "a mapping with 'version: 1'")
    reject_duplicate_keys(file, root)
    return SpecReader(file, loader), root


class SpecReader:
    """Reads the composed nodes of one spec file: typed values or a located error.

    Every problem becomes a :class:`SpecError` naming file:line:column (of the node), the
    YAML path, the bad value and what is allowed. Mappings refuse duplicate and unknown
    keys. Used for matrices and for gates.yaml alike.
    """

    def __init__(self, file: str, loader: yaml.SafeLoader) -> None:
        self.file = file
        self.loader = loader
        #: (YAML path of a mesh list, mesh text) -> its node, for located rank-limit errors.
        self.mesh_nodes: dict[tuple[str, str], tuple[yaml.Node, str]] = {}

    def error(
        self, node: yaml.Node, path: str, message: str, allowed: str = "", hint: str = ""
    ) -> SpecError:
        mark = node.start_mark
        return SpecError(self.file, mark.line + 1, mark.column + 1, path, message, allowed,
                         hint)

    def scalar(self, node: yaml.Node, path: str) -> Scalar:
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(node, path, f"expected a scalar, got a {kind_of(node)}")
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
            raise self.error(node, path, f"expected a mapping, got a {kind_of(node)}")
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = self.scalar(key_node, path)
            key = render(key) if not isinstance(key, str) else key
            sub = f"{path}.{key}" if path else key
            if key in seen:
                raise self.error(key_node, sub, f"duplicate key {key!r}")
            seen.add(key)
            if allowed is not None and key not in allowed:
                raise self.error(key_node, sub, f"unknown key {key!r}", ", ".join(allowed),
                                 suggestion(key, allowed))
            yield key, key_node, value_node

    def sequence(self, node: yaml.Node, path: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.error(node, path, f"expected a list, got a {kind_of(node)}")
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


    def string_list(self, node: yaml.Node, path: str) -> tuple[str, ...]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.error(node, path, f"must be a list of strings, got "
                             f"{self.loader.construct_object(node, deep=True)!r}")
        out = []
        for i, item in enumerate(node.value):
            value = self.loader.construct_object(item, deep=True)
            if not isinstance(value, str) or not value:
                raise self.error(item, f"{path}[{i}]", f"must be a non-empty string, got {value!r}")
            out.append(value)
        return tuple(out)

    def number_in(self, node: yaml.Node, path: str, *, low: float, high: float) -> float:
        value = self.loader.construct_object(node, deep=True)
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or math.isnan(value) or not low <= value <= high:
            raise self.error(node, path, f"must be a number in [{low:g}, {high:g}], got {value!r}")
        return float(value)

    def flag(self, node: yaml.Node, path: str) -> bool:
        value = self.loader.construct_object(node, deep=True)
        if not isinstance(value, bool):
            raise self.error(node, path, f"must be true or false, got {value!r}")
        return value


def kind_of(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "mapping"
    if isinstance(node, yaml.SequenceNode):
        return "list"
    return "scalar"


def render(value: Scalar) -> str:
    """How a scalar appears in ids and comparisons (YAML's on/off read as booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)




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
