"""Each default is written once: its home declares it, every reader imports it.

The defaults that several layers must agree on (a cell's timeout, the runner, the
launcher, the abort grace) are listed here with their home and their readers. A source
scan (no import of the readers) fails on a literal copy of a default's value in a reader,
on a reader that no longer imports the name, and on a new field or parameter of the
default's name anywhere in the package that writes the value itself. The pytest plugin's
flags are checked against the CLI's declarations: same defaults, the same objects.
"""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest

from cpmatrix import defaults
from cpmatrix.supervise.options import RunOptions
from cpmatrix.supervise.settings import FaultTimings
from plugin_options import plugin_options

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "cpmatrix"


@dataclass(frozen=True)
class Default:
    """One default: where it is declared, its value, the names it goes by."""

    #: ``module:NAME`` of the declaration.
    home: str
    value: object
    #: Modules (relative to the package) that must import ``home``'s name, not copy it.
    readers: tuple[str, ...]
    #: Field and parameter names that carry this default wherever they are written.
    names: tuple[str, ...]
    #: Modules that get it through another reader and must not copy it either.
    through: tuple[str, ...] = ()


DEFAULTS: tuple[Default, ...] = (
    Default("cpmatrix.defaults:TIMEOUT_S", defaults.TIMEOUT_S,
            ("matrix/schema.py", "matrix/load.py", "kinds/pytest/spec.py",
             "worker/protocol/records.py", "kinds/pytest/plugin.py"),
            ("timeout_s", "DEFAULT_TIMEOUT_S")),
    # The abort grace is FaultTimings' own; the pytest front takes it from RunOptions.
    Default("cpmatrix.supervise.settings:FaultTimings", FaultTimings().abort_grace_s,
            ("supervise/options.py",), ("abort_grace_s",), through=("kinds/pytest/plugin.py",)),
    Default("cpmatrix.defaults:RUNNER", defaults.RUNNER, ("supervise/options.py",), ("runner",),
            through=("kinds/pytest/plugin.py",)),
    Default("cpmatrix.defaults:LAUNCHER", defaults.LAUNCHER,
            ("supervise/options.py", "supervise/context.py"), ("launcher",),
            through=("kinds/pytest/plugin.py",)),
)


def _same(node: ast.AST, value: object) -> bool:
    """A literal equal to ``value`` (300 and 300.0 alike; True is no 1)."""
    if not isinstance(node, ast.Constant) or isinstance(node.value, bool):
        return False
    if isinstance(value, str):
        return node.value == value
    return isinstance(node.value, int | float) and node.value == value


def copies_in(source: str, default: Default) -> list[int]:
    """Lines of ``source`` that write ``default``'s value as a literal in code (a
    docstring or a message text is no copy; a piece of an f-string is not either)."""
    tree = ast.parse(source)
    bare = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    return sorted(n.lineno for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and _same(n, default.value)
                  and id(n) not in bare)


def imports_home(source: str, default: Default) -> bool:
    module, name = default.home.split(":")
    return any(isinstance(n, ast.ImportFrom) and n.module == module
               and any(a.name == name for a in n.names) for n in ast.walk(ast.parse(source)))


def named_copies(source: str, default: Default) -> list[int]:
    """Lines where a field, parameter, keyword or assignment of one of ``default``'s
    names gets its value as a literal."""
    tree = ast.parse(source)
    found: list[int] = []
    for n in ast.walk(tree):
        pairs: list[tuple[str, ast.expr | None]] = []
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            pairs.append((n.target.id, n.value))
        elif isinstance(n, ast.Assign):
            pairs += [(t.id, n.value) for t in n.targets if isinstance(t, ast.Name)]
        elif isinstance(n, ast.keyword) and n.arg is not None:
            pairs.append((n.arg, n.value))
        elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
            args = [*n.args.posonlyargs, *n.args.args]
            pairs += [(a.arg, d) for a, d in zip(args[len(args) - len(n.args.defaults):],
                                                 n.args.defaults, strict=True)]
            pairs += [(a.arg, d) for a, d in zip(n.args.kwonlyargs, n.args.kw_defaults,
                                                 strict=True)]
        found += [value.lineno for name, value in pairs
                  if name in default.names and value is not None and _same(value, default.value)]
    return found


def _home_file(default: Default) -> str:
    module = default.home.split(":")[0].removeprefix("cpmatrix.").replace(".", "/")
    return f"{module}.py"


@pytest.mark.parametrize("default", DEFAULTS, ids=lambda d: d.home)
def test_each_reader_imports_the_default_and_copies_it_nowhere(default: Default) -> None:
    for reader in (*default.readers, *default.through):
        source = (PACKAGE / reader).read_text()
        assert reader in default.through or imports_home(source, default), (
            f"{reader} must import {default.home}")
        assert copies_in(source, default) == [], (
            f"{reader}:{copies_in(source, default)}: {default.value!r} written again; "
            f"import {default.home}")


@pytest.mark.parametrize("default", DEFAULTS, ids=lambda d: d.home)
def test_no_module_but_the_home_writes_the_default_under_its_name(default: Default) -> None:
    home = _home_file(default)
    found = [f"{p.relative_to(PACKAGE)}:{line}" for p in sorted(PACKAGE.rglob("*.py"))
             if p.relative_to(PACKAGE).as_posix() != home
             for line in named_copies(p.read_text(), default)]
    assert found == [], f"{default.value!r} written again (import {default.home}): {found}"


PLANTED = '''
from dataclasses import dataclass

@dataclass
class Spec:
    """A timeout of 300 s, said in a docstring, is no copy."""
    timeout_s: int = 300

def launch(runner="local", *, launcher: str = "fork", abort_grace_s=5.0):
    return f"{runner} (default: local)"
'''


def test_the_scans_see_planted_copies() -> None:
    timeout, grace, runner, launcher = DEFAULTS
    assert copies_in(PLANTED, timeout) == [7]
    assert named_copies(PLANTED, timeout) == [7]
    assert named_copies(PLANTED, runner) == [9]
    assert named_copies(PLANTED, launcher) == [9]
    assert named_copies(PLANTED, grace) == [9]
    assert copies_in(PLANTED, runner) == [9]  # the f-string's "(default: local)" is not
    assert not imports_home(PLANTED, timeout)
    assert imports_home("from cpmatrix.defaults import TIMEOUT_S\n", timeout)


def test_the_plugin_flags_take_the_cli_declarations() -> None:
    """Each plugin flag of a run setting has the CLI flag's default object, type and
    choices; reading the flags' defaults back gives the CLI's default options."""
    options = plugin_options()
    by_name = {f.name: f for f in dataclasses.fields(RunOptions)}
    shared = {"--cpmatrix-runner": "runner", "--cpmatrix-launcher": "launcher",
              "--cpmatrix-world-ranks": "world_ranks",
              "--cpmatrix-abort-grace": "abort_grace_s"}
    for flag, name in shared.items():
        declared = by_name[name]
        assert options[flag]["default"] is declared.default, flag
        for key in ("type", "choices", "metavar"):
            assert options[flag].get(key) == declared.metadata["argparse"].get(key), (flag, key)
    assert options["--cpmatrix-runner"]["default"] is defaults.RUNNER
    assert options["--cpmatrix-launcher"]["default"] is defaults.LAUNCHER
    assert options["--cpmatrix-abort-grace"]["default"] == FaultTimings().abort_grace_s
    assert str(defaults.TIMEOUT_S) in options["--cpmatrix-timeout"]["help"]
    values = {flag.removeprefix("--").replace("-", "_"): o["default"]
              for flag, o in options.items()}
    read = RunOptions.from_pytest(values.__getitem__)
    assert {n: getattr(read, n) for n in shared.values()} == \
        {n: getattr(RunOptions(), n) for n in shared.values()}


def test_the_plugin_keeps_its_flags_and_their_help() -> None:
    """The names and help texts users know (docs/pytest.md's table)."""
    options = plugin_options()
    assert list(options) == [
        "--cpmatrix", "--cpmatrix-out", "--cpmatrix-timeout", "--cpmatrix-runner",
        "--cpmatrix-launcher", "--cpmatrix-world-ranks", "--cpmatrix-abort-grace",
        "--cpmatrix-device", "--cpmatrix-cache"]
    assert options["--cpmatrix-runner"]["help"] == (
        "how worlds are isolated: local, sandbox, docker (default: local)")
    assert options["--cpmatrix-launcher"]["help"] == "how ranks start (default: fork)"
    assert options["--cpmatrix-abort-grace"]["help"].endswith(
        "(then the world is torn down; default: 5)")
    assert options["--cpmatrix-timeout"]["help"].endswith(
        "(default: pytest-timeout's --timeout if set, else 300)")
