"""Before any world starts: does every selected target's case function exist?

Read statically: the case module is found on the matrix's ``pythonpath`` (as the digest
finds it) and parsed with :mod:`ast`, never imported, so checking a whole matrix costs
no torch import. A module-level name counts as defined when a ``def``, ``class``,
assignment or import binds it at the top level (in ``if``/``try``/``with``/``for``
blocks too). Where the module can make names the parser cannot see (``from x import *``,
a module ``__getattr__``, ``globals()``/``vars()``/``setattr``/``exec`` at its top level,
``globals()``, ``sys.modules`` or ``__dict__`` in any function), a case it does not bind
visibly is looked up by importing that one module, in a child interpreter with the
matrix's ``pythonpath`` (:func:`imported_names`): a name it makes at import is found,
one it does not make is reported as any other; a module that fails to import is left
to the world, which shows the import error. A module that does not parse is reported
at its syntax error.

Example::

    >>> names, dynamic = module_names("import os\\nfrom a import b as c\\ndef f(): pass\\n")
    >>> sorted(names), dynamic
    (['c', 'f', 'os'], False)
    >>> module_names("from torch import *\\n")[1]
    True
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from cpmatrix.digest import ModuleSources
from cpmatrix.errors import SpecError
from cpmatrix.matrix.schema import Cell, Matrix, Target
from cpmatrix.suggest import did_you_mean

__all__ = ["check_cases", "imported_names", "module_names"]

#: Names that let a module bind names at its top level the parser cannot see...
_TOP_DYNAMIC: Final = frozenset({"globals", "vars", "setattr", "exec"})
#: ... and those that do so from inside a function the module calls (``setattr`` or
#: ``vars`` in a function are mostly about other objects: not counted there).
_ANY_DYNAMIC: Final = frozenset({"globals", "exec"})
#: Attributes that reach a module's namespace: ``sys.modules[...]``, ``mod.__dict__``.
_DYNAMIC_ATTRS: Final = frozenset({"modules", "__dict__"})
#: Seconds an import of one case module may take (torch's import included).
_IMPORT_TIMEOUT_S: Final = 300.0
#: Run in the child: import the module, print which of the names it has, and its names.
_PROBE: Final = """\
import importlib, json, sys
path, module, wanted = json.loads(sys.argv[1])
sys.path[:0] = path
m = importlib.import_module(module)
print(json.dumps({"has": [n for n in wanted if hasattr(m, n)], "names": sorted(dir(m))}))
"""


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
            dynamic |= node.name == "__getattr__" or _reaches_namespace(node, _ANY_DYNAMIC)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    dynamic = True
                names.add(alias.asname or alias.name.split(".")[0])
            continue
        for child in ast.walk(node):
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                names.add(child.id)
            elif isinstance(child, ast.NamedExpr) and isinstance(child.target, ast.Name):
                names.add(child.target.id)
        dynamic |= _reaches_namespace(node, _TOP_DYNAMIC)
        for block in ("body", "orelse", "finalbody", "handlers"):
            for inner in getattr(node, block, ()) or ():
                if isinstance(inner, ast.ExceptHandler):
                    stack.extend(inner.body)
                    if inner.name:
                        names.add(inner.name)
                elif isinstance(inner, ast.stmt):
                    stack.append(inner)
    return names, dynamic


def _reaches_namespace(node: ast.AST, calls: frozenset[str]) -> bool:
    """``node`` (and what it holds) may bind module names by other means than a statement:
    a name of ``calls`` (``globals()``...), ``sys.modules`` or a ``__dict__``."""
    return any((isinstance(n, ast.Name) and n.id in calls)
               or (isinstance(n, ast.Attribute) and n.attr in _DYNAMIC_ATTRS)
               for n in ast.walk(node))


def imported_names(search_path: Sequence[str], module: str, wanted: Sequence[str]
                   ) -> tuple[set[str], list[str]] | None:
    """Import ``module`` in a child interpreter with ``search_path`` first on its path:
    (the names of ``wanted`` it has, all its names); None when it cannot be imported
    (the world will show why) or the child fails otherwise."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, json.dumps([list(search_path), module,
                                                       list(wanted)])],
            capture_output=True, text=True, timeout=_IMPORT_TIMEOUT_S, check=False)
        if done.returncode != 0:
            return None
        found = json.loads(done.stdout.strip().splitlines()[-1])
        return set(found["has"]), [str(n) for n in found["names"]]
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError, KeyError):
        return None


def check_cases(matrix: Matrix, cells: Iterable[Cell]) -> None:
    """Raise :class:`SpecError` at the ``case:`` of the first selected target whose case
    function does not exist (or whose module does not parse), naming the module's file
    and line; the others with it are counted in the message."""
    wanted = {c.target for c in cells if c.kind != "pytest"}
    sources = ModuleSources(matrix.pythonpath)
    parsed: dict[str, tuple[str, set[str], bool] | _Problem] = {}
    unseen: list[tuple[int, Target, str, str]] = []  # (index, target, module, attr)
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
        elif attr and attr not in found[1]:
            unseen.append((index, target, module, attr))
    problems += _absent(matrix, parsed, unseen)
    problems.sort(key=lambda p: p.index)
    if problems:
        first = problems[0]
        line, column = first.target.case_at
        more = _more(problems[1:])
        file = first.target.where.rpartition(":")[0] or matrix.path
        raise SpecError(file, line, column, f"targets[{first.index}].case",
                        first.message + more, first.allowed)


def _absent(matrix: Matrix, parsed: dict[str, tuple[str, set[str], bool] | _Problem],
            unseen: Sequence[tuple[int, Target, str, str]]) -> list[_Problem]:
    """The cases not bound visibly that are absent: read statically, or, in a module that
    makes names at import, by importing it (once per module)."""
    imported: dict[str, tuple[set[str], list[str]] | None] = {}
    problems = []
    for index, target, module, attr in unseen:
        file, names, dynamic = parsed[module]  # type: ignore[misc]
        how = ""
        funcs = sorted(n for n in names if not n.startswith("_"))
        if dynamic:
            if module not in imported:
                attrs = [a for _, _, m, a in unseen if m == module]
                imported[module] = imported_names(matrix.pythonpath, module, attrs)
            found = imported[module]
            if found is None or attr in found[0]:
                continue  # made at import (or not importable: the world says why)
            funcs = sorted(n for n in found[1] if not n.startswith("_"))
            how = " (imported to look: it makes names at import)"
        problems.append(_Problem(
            index, target,
            f"case {target.case!r}: {file} defines no {attr!r}{how}{did_you_mean(attr, funcs)}",
            "a function defined at the top level of the module"))
    return problems


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
