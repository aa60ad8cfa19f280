"""The installed modules a world's test files import, imported once before the ranks fork.

Each rank builds its pytest session and collects the test files again
(:mod:`cpmatrix.pytest_front.rank`); most of that is importing what the test files import
from installed packages (PyTorch's ``torch.testing._internal...common_dtensor`` chain:
about 0.9 s of a rank's 1.5 s on this machine). Those modules are the same in every
rank, so the fork launcher imports them once, in its parent, and every rank inherits
them (:func:`preload`, called from the world's ``before_fork``).

Only what is faithful to import early is imported:

- modules named by an **unconditional** import of a test file or of a ``conftest.py``
  above it (the module body and top-level ``try`` bodies: what running the file imports
  whatever the machine; not ``if`` branches, not function bodies);
- **installed** ones only: the standard library or a non-editable distribution's files
  (the same rule that keeps them out of the cache's observed set, so the cache key is
  unchanged: they are covered by the toolchain's ``name==version``), found at the same
  place from the rank's ``sys.path`` as from the launcher's;
- never a package that registers a pytest plugin (``pytest11``): pytest rewrites the
  asserts of those and warns when one was imported before it (an error under
  ``-W error``);
- absolute imports only; a module that fails to import is left for the rank, which
  reports the error as it would natively.

Example::

    >>> import ast
    >>> unconditional_imports(ast.parse(
    ...     "import a.b\\nfrom c import d\\nif x:\\n    import e\\n"
    ...     "try:\\n    import f\\nexcept ImportError:\\n    import g\\n"
    ...     "def h():\\n    import i\\nfrom . import j\\n"))
    ['a.b', 'c', 'f']
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

__all__ = ["files_to_read", "installed_imports", "plugin_packages", "preload",
           "unconditional_imports"]


def unconditional_imports(tree: ast.Module) -> list[str]:
    """Absolute module names a module's body imports whenever it runs, in order."""
    out: list[str] = []
    body = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                out.append(node.module)
        elif isinstance(node, ast.Try):
            body[:0] = node.body  # the try body runs; the handlers only on an error
    return list(dict.fromkeys(out))


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
    if spec is None:
        return None
    if spec.origin in ("built-in", "frozen"):
        return spec.origin
    return spec.origin if spec.origin else None


def installed_imports(files: Iterable[str], rank_path: Sequence[str],
                      installed: Callable[[str], bool], excluded: set[str]) -> list[str]:
    """The modules of ``files``' unconditional imports that are safe to import early:
    top-level package installed (``installed(path)``), found at the same place from
    ``rank_path`` as from this process's ``sys.path``, not in ``excluded``, not loaded."""
    names: list[str] = []
    for file in files:
        try:
            tree = ast.parse(Path(file).read_bytes(), filename=file)
        except (OSError, SyntaxError, ValueError):
            continue  # the rank's collection reports it
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


def preload(test_files: Iterable[str], rootdir: str, rank_path: Sequence[str],
            installed: Callable[[str], bool]) -> list[str]:
    """Import the installed modules the test files import (:func:`installed_imports`);
    the names imported. Never raises: what fails is the rank's to report."""
    try:
        names = installed_imports(files_to_read(test_files, rootdir), rank_path, installed,
                                  {*plugin_packages(), "conftest", "cpmatrix"})
    except Exception:
        return []
    done: list[str] = []
    for name in names:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # SystemExit too: a module may exit at import
            if isinstance(exc, KeyboardInterrupt):
                raise
            continue
        done.append(name)
    return done
