"""Before any world starts: does every selected target's case function exist?

Read statically: the case module is found on the matrix's ``pythonpath`` (as the digest
finds it) and parsed with :mod:`ast`, never imported, so checking a whole matrix costs
no torch import. A module-level name counts as defined when a ``def``, ``class``,
assignment or import binds it at the top level (in ``if``/``try``/``with``/``for``
blocks too). Where the module can make names the parser cannot see (``from x import *``,
a module ``__getattr__``, ``globals()``), the check says nothing and the world's import
decides. A module that does not parse is reported at its syntax error.

Example::

    >>> names, dynamic = module_names("import os\\nfrom a import b as c\\ndef f(): pass\\n")
    >>> sorted(names), dynamic
    (['c', 'f', 'os'], False)
    >>> module_names("from torch import *\\n")[1]
    True
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cpmatrix.digest import ModuleSources
from cpmatrix.errors import SpecError
from cpmatrix.matrix.schema import Cell, Matrix, Target
from cpmatrix.suggest import did_you_mean

__all__ = ["check_cases", "module_names"]


@dataclass(frozen=True, slots=True)
class _Problem:
    index: int
    target: Target
    message: str
    allowed: str = ""


def module_names(source: str, filename: str = "<case module>") -> tuple[set[str], bool]:
    """The names ``source`` binds at module level, and whether it may bind others the
    parser cannot see. ``SyntaxError`` for a module that does not parse."""
    tree = ast.parse(source, filename)
    names: set[str] = set()
    dynamic = False
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
            dynamic |= node.name == "__getattr__"
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    dynamic = True
                names.add(alias.asname or alias.name.split(".")[0])
            continue
        for child in ast.walk(node):
            if isinstance(child, ast.Name):
                if isinstance(child.ctx, ast.Store):
                    names.add(child.id)
                dynamic |= child.id in ("globals", "vars", "setattr", "exec")
            elif isinstance(child, ast.NamedExpr) and isinstance(child.target, ast.Name):
                names.add(child.target.id)
        for block in ("body", "orelse", "finalbody", "handlers"):
            for inner in getattr(node, block, ()) or ():
                if isinstance(inner, ast.ExceptHandler):
                    stack.extend(inner.body)
                    if inner.name:
                        names.add(inner.name)
                elif isinstance(inner, ast.stmt):
                    stack.append(inner)
    return names, dynamic


def check_cases(matrix: Matrix, cells: Iterable[Cell]) -> None:
    """Raise :class:`SpecError` at the ``case:`` of the first selected target whose case
    function does not exist (or whose module does not parse), naming the module's file
    and line; the others with it are counted in the message."""
    wanted = {c.target for c in cells if c.kind != "pytest"}
    sources = ModuleSources(matrix.pythonpath)
    parsed: dict[str, tuple[str, set[str], bool] | _Problem] = {}
    problems: list[_Problem] = []
    for index, target in enumerate(matrix.targets):
        if target.name not in wanted or target.pytest:
            continue
        module, _, attr = target.case.partition(":")
        if module not in parsed:
            parsed[module] = _parse(sources, module, index, target)
        found = parsed[module]
        if isinstance(found, _Problem):
            problems.append(_Problem(index, target, found.message, found.allowed))
            continue
        file, names, dynamic = found
        if attr and attr not in names and not dynamic:
            funcs = sorted(n for n in names if not n.startswith("_"))
            problems.append(_Problem(
                index, target,
                f"case {target.case!r}: {file} defines no {attr!r}"
                f"{did_you_mean(attr, funcs)}",
                "a function defined at the top level of the module"))
    if problems:
        first = problems[0]
        line, column = first.target.case_at
        more = _more(problems[1:])
        file = first.target.where.rpartition(":")[0] or matrix.path
        raise SpecError(file, line, column, f"targets[{first.index}].case",
                        first.message + more, first.allowed)


def _parse(sources: ModuleSources, module: str, index: int, target: Target
           ) -> tuple[str, set[str], bool] | _Problem:
    try:
        file = sources.locate(module)
        text = sources.read(module).decode("utf-8", errors="replace")
    except LookupError as exc:  # expand refuses this first; kept for a direct caller
        return _Problem(index, target, f"case module of {target.case!r} not found: {exc}")
    try:
        names, dynamic = module_names(text, file)
    except SyntaxError as exc:
        return _Problem(index, target, f"case module {file}:{exc.lineno or 0}: syntax error: "
                        f"{exc.msg}")
    return file, names, dynamic


def _more(rest: Sequence[_Problem]) -> str:
    if not rest:
        return ""
    names = ", ".join(p.target.name for p in rest[:5])
    return f"; and {len(rest)} more target(s) with a missing case: {names}"
