"""The installed modules a world's test files import, imported once before the ranks fork.

Each rank builds its pytest session and collects the test files again
(:mod:`cpmatrix.kinds.pytest.rank_session`); most of that is importing what the test files import
from installed packages (PyTorch's ``torch.testing._internal...common_dtensor`` chain:
about 0.9 s of a rank's 1.5 s on this machine). Those modules are the same in every
rank, so the fork launcher imports them once, in its parent, and every rank inherits
them (:func:`preload`, called from the world's ``before_fork``).

Only what is faithful to import early is imported:

- modules named by a test file's **leading** imports (after its docstring; a ``try``
  holding only imports counts), up to its first statement of any other kind: importing
  them earlier runs nothing of the file before them;
- only for test files whose ``conftest.py`` files (from the rootdir down) run nothing of
  the suite's own at import (imports, definitions with plain decorators, literals; no
  early hook such as ``pytest_configure``), whose leading imports count too; a conftest
  that sets a variable or defines ``pytest_configure`` could change what the imports
  see, so its tests get no early imports;
- **installed** ones only: the standard library or a non-editable distribution's files
  (the same rule that keeps them out of the cache's observed set: they are covered by
  the toolchain's ``name==version``), found at the same place from the rank's
  ``sys.path`` as from the launcher's; imported in the folder the tests run in; what
  they read is observed (``world_main``) and is every cell's input;
- never a package pytest rewrites the asserts of (a ``pytest11`` plugin's, a
  ``pytest_plugins`` entry, a ``register_assert_rewrite`` argument, a ``-p`` plugin):
  pytest warns when one was imported before it (an error under ``-W error``);
- absolute imports only; a module that fails to import is left for the rank, which
  reports the error as it would natively.

Example::

    >>> import ast
    >>> unconditional_imports(ast.parse(
    ...     "'doc'\\nimport a.b\\nfrom c import d\\ntry:\\n    import f\\n"
    ...     "except ImportError:\\n    import g\\nX = 1\\nimport h\\n"))
    ['a.b', 'c', 'f']
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

__all__ = ["early_imports", "files_to_read", "installed_imports", "plugin_packages", "preload",
           "quiet_conftest", "rewritten_names", "unconditional_imports"]


def _import_names(node: ast.stmt) -> list[str] | None:
    """The absolute modules an import statement names (None: not an import)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        return [node.module] if node.level == 0 and node.module else []
    return None


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
        and isinstance(node.value.value, str)


def unconditional_imports(tree: ast.Module) -> list[str]:
    """The absolute modules a module imports *first*, before any other code of it runs:
    its leading import statements (after the docstring; a ``try`` holding only imports
    counts, its body runs), up to the first statement of any other kind. Importing
    those earlier changes nothing the module did before them."""
    out: list[str] = []
    for i, node in enumerate(tree.body):
        names = _import_names(node)
        if names is not None:
            out += names
        elif i == 0 and _is_docstring(node):
            continue
        elif isinstance(node, ast.Try) and all(
                _import_names(n) is not None for n in node.body):
            out += [m for n in node.body for m in _import_names(n) or []]
        else:
            break
    return [m for m in dict.fromkeys(out) if m != "__future__"]


#: Hooks a conftest can run before the test modules are imported: code of the suite's
#: that must run before anything it imports (so such a suite gets no early imports).
_EARLY_HOOKS = frozenset({
    "pytest_configure", "pytest_sessionstart", "pytest_load_initial_conftests",
    "pytest_cmdline_main", "pytest_cmdline_parse", "pytest_cmdline_preparse",
    "pytest_plugin_registered", "pytest_addhooks", "pytest_collection",
})
#: Decorators that only register what they decorate.
_PLAIN_DECORATORS = frozenset({"fixture", "hookimpl", "hookspec", "pytest.fixture",
                               "pytest.hookimpl", "pytest.hookspec"})


def _decorator_name(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    return ast.unparse(target)


def quiet_conftest(tree: ast.Module) -> bool:
    """Whether importing a ``conftest.py`` runs nothing of the suite's own before the test
    modules are imported: imports, definitions with plain decorators (no early hook),
    names bound to literals. Only then may its tests' imports be made earlier."""
    for i, node in enumerate(tree.body):
        if _import_names(node) is not None or (i == 0 and _is_docstring(node)):
            continue
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name in _EARLY_HOOKS or any(
                    _decorator_name(d) not in _PLAIN_DECORATORS for d in node.decorator_list):
                return False
            continue
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            try:
                ast.literal_eval(node.value)
            except ValueError:
                return False
            continue
        return False
    return True


def rewritten_names(trees: Iterable[ast.Module], args: Sequence[str]) -> set[str]:
    """Top-level modules pytest rewrites the asserts of besides ``pytest11`` plugins:
    ``pytest_plugins`` entries, ``register_assert_rewrite(...)`` arguments, ``-p NAME``."""
    out: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "pytest_plugins" for t in node.targets):
                with contextlib.suppress(ValueError):
                    value = ast.literal_eval(node.value)
                    out |= {value} if isinstance(value, str) else {str(v) for v in value}
            elif isinstance(node, ast.Call) and _decorator_name(node).endswith(
                    "register_assert_rewrite"):
                out |= {a.value for a in node.args
                        if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    for i, arg in enumerate(args):
        name = args[i + 1] if arg == "-p" and i + 1 < len(args) else (
            arg[2:] if arg.startswith("-p") and len(arg) > 2 else "")
        if name and not name.startswith("no:"):
            out.add(name)
    return {name.split(".", 1)[0] for name in out}


def files_to_read(test_files: Iterable[str], rootdir: str) -> list[str]:
    """The test files and every ``conftest.py`` from ``rootdir`` down to each, conftests
    first (pytest imports them first)."""
    root = Path(rootdir)
    confs: list[str] = []
    tests: list[str] = []
    for name in test_files:
        path = Path(name)
        tests.append(str(path))
        folders = [path.parent, *path.parent.parents]
        for folder in reversed(folders):
            if folder == root or root in folder.parents:
                conf = folder / "conftest.py"
                if conf.is_file():
                    confs.append(str(conf))
    return list(dict.fromkeys([*confs, *tests]))


def plugin_packages() -> set[str]:
    """Top-level package names of the distributions that register a ``pytest11`` plugin."""
    from importlib.metadata import distributions

    out: set[str] = set()
    for dist in distributions():
        try:
            eps = dist.entry_points
        except Exception:  # a broken METADATA: be safe, but it cannot name its packages
            continue
        plugins = [ep for ep in eps if ep.group == "pytest11"]
        if not plugins:
            continue
        out |= {ep.value.split(":", 1)[0].split(".", 1)[0] for ep in plugins}
        top = dist.read_text("top_level.txt") or ""
        out |= {line.strip() for line in top.splitlines() if line.strip()}
        for file in dist.files or ():
            parts = Path(str(file)).parts
            if parts and not parts[0].endswith((".dist-info", ".egg-info", ".data")):
                out.add(parts[0].removesuffix(".py").split(".", 1)[0])
    return out


def _origin(name: str, path: Sequence[str] | None) -> str | None:
    """Where the top-level ``name`` is found (its file or package folder), None if not."""
    try:
        spec = (importlib.machinery.PathFinder.find_spec(name, list(path)) if path is not None
                else importlib.util.find_spec(name))
    except (ImportError, ValueError):
        return None
    return spec.origin or None if spec is not None else None


def _parse(file: str) -> ast.Module | None:
    try:
        return ast.parse(Path(file).read_bytes(), filename=file)
    except (OSError, SyntaxError, ValueError):
        return None  # the rank's collection reports it


def installed_imports(files: Iterable[str], rank_path: Sequence[str],
                      installed: Callable[[str], bool], excluded: set[str]) -> list[str]:
    """The modules of ``files``' leading imports (:func:`unconditional_imports`) that are
    safe to import early: top-level package installed (``installed(path)``), found at the
    same place from ``rank_path`` as from this process's ``sys.path``, not in
    ``excluded``, not loaded."""
    names: list[str] = []
    for file in files:
        tree = _parse(file)
        if tree is not None:
            names += unconditional_imports(tree)
    out: list[str] = []
    verdicts: dict[str, bool] = {}
    for name in dict.fromkeys(names):
        top = name.split(".", 1)[0]
        if name in sys.modules or top in excluded:
            continue
        if top not in verdicts:
            here = _origin(top, None) if top not in sys.modules else getattr(
                sys.modules[top], "__file__", None)
            there = _origin(top, rank_path)
            verdicts[top] = bool(here) and here == there and (
                here in ("built-in", "frozen") or installed(os.path.abspath(str(here))))
        if verdicts[top]:
            out.append(name)
    return out


def early_imports(test_files: Iterable[str], rootdir: str, rank_path: Sequence[str],
                  installed: Callable[[str], bool], args: Sequence[str] = ()) -> list[str]:
    """What :func:`preload` imports for ``test_files``: for each test file whose
    conftests are all quiet (:func:`quiet_conftest`), the installed modules its conftests
    and itself import first; never a plugin's package (``pytest11``, ``pytest_plugins``,
    ``register_assert_rewrite``, ``-p``)."""
    files: list[str] = []
    trees: list[ast.Module] = []
    for test in test_files:
        chain = files_to_read([test], rootdir)
        parsed = [_parse(f) for f in chain]
        if any(t is None for t in parsed) or not all(
                quiet_conftest(t) for f, t in zip(chain, parsed, strict=True)
                if t is not None and f != test):
            continue
        files += chain
        trees += [t for t in parsed if t is not None]
    excluded = {*plugin_packages(), *rewritten_names(trees, args), "conftest", "cpmatrix"}
    return installed_imports(dict.fromkeys(files), rank_path, installed, excluded)


def preload(test_files: Iterable[str], rootdir: str, rank_path: Sequence[str],
            installed: Callable[[str], bool], *, cwd: str = "",
            args: Sequence[str] = ()) -> list[str]:
    """Import :func:`early_imports`, in ``cwd`` (the folder the tests run in; the
    launcher's own after); the names imported. Never raises: what fails is the rank's
    to report."""
    try:
        names = early_imports(test_files, rootdir, rank_path, installed, args)
    except Exception:
        return []
    here = os.getcwd()
    done: list[str] = []
    try:
        if cwd:
            os.chdir(cwd)
        for name in names:
            try:
                importlib.import_module(name)
            except BaseException as exc:  # SystemExit too: a module may exit at import
                if isinstance(exc, KeyboardInterrupt):
                    raise
                continue
            done.append(name)
    finally:
        os.chdir(here)
    return done
