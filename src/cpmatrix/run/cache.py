"""Bazel-style result cache: a PASS is stored under the cell's action digest.

The action digest covers everything a cell's result depends on:

- the cell digest (its spec, its case module's source, its platform spec);
- the source of every project-local module the case module imports, transitively
  (found by reading ``import`` statements, without importing anything);
- cpmatrix's version and the source of its worker-side modules;
- the runner's identity (the image digest when cells run in a container);
- the interpreter that runs the worlds (real path, version) and its installed
  distributions (every ``name==version``; see :mod:`cpmatrix.run.toolchain`);
- the values of the environment allow-list and the platform's environment.

Only passes are stored; failures, flaky results and timeouts are never reused. Entries
are written atomically, so concurrent runs can share a cache folder; a corrupt entry
is ignored (and rewritten by the next pass).

Example::

    >>> keys = ActionKeys(search_path=("tests/resources/cases",))       # doctest: +SKIP
    >>> cache = ResultCache(Path("~/.cache/cpmatrix").expanduser())      # doctest: +SKIP
    >>> cache.get(keys.digest(cell, runner_identity={}, env={}))         # doctest: +SKIP
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from cpmatrix import __version__
from cpmatrix.digest import ModuleSources, canonical_json
from cpmatrix.fsutil import atomic_write_json
from cpmatrix.matrix.schema import Cell
from cpmatrix.paths import PACKAGE_DIR
from cpmatrix.result import Result, Status

__all__ = ["ActionKeys", "ResultCache", "default_cache_dir"]

#: cpmatrix's package folder (``.../cpmatrix``), from a checkout or a wheel alike.
_PACKAGE_DIR = PACKAGE_DIR
#: Modules of cpmatrix that run inside the world: a change to them changes every result.
_RUNTIME_MODULES = ("cpmatrix.remote.world_main", "cpmatrix.cell", "cpmatrix.fsutil",
                    "cpmatrix.remote.isolation", "cpmatrix.remote.procs",
                    "cpmatrix.remote.cellenv", "cpmatrix.remote.inventory",
                    "cpmatrix.remote.namespaces", "cpmatrix.remote.hygiene",
                    "cpmatrix.remote.forks", "cpmatrix.remote.exchange",
                    "cpmatrix.remote.meshes", "cpmatrix.remote.stacks")


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cpmatrix"


def _imports(source: bytes, module: str, is_package: bool) -> list[str]:
    r"""Absolute names of the modules ``source`` imports (relative imports resolved).

    ``from pkg import name`` also yields ``pkg.name``: it may be a submodule. Names that
    are not project-local modules are dropped later, when they cannot be located.

    >>> src = b"import os\nfrom .helper import f\nfrom .. import sibling"
    >>> _imports(src, "pkg.sub.mod", is_package=False)
    ['os', 'pkg.sub.helper', 'pkg.sub.helper.f', 'pkg', 'pkg.sibling']
    >>> _imports(b"from . import helper", "pkg", is_package=True)   # pkg/__init__.py
    ['pkg', 'pkg.helper']
    >>> _imports(b"from ... import x", "pkg.mod", is_package=False)  # above the top: none
    []
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    package = module if is_package else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = (_resolve_relative(package, node.level, node.module) if node.level
                   else node.module)
            if mod:
                names.append(mod)
                names.extend(f"{mod}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def _resolve_relative(package: str, level: int, name: str | None) -> str | None:
    """What ``from <level dots><name> import ...`` in ``package`` names, as importlib does;
    None when the dots climb above the top-level package (an ImportError in Python).

    >>> _resolve_relative("pkg.sub", 1, "helper"), _resolve_relative("pkg.sub", 2, None)
    ('pkg.sub.helper', 'pkg')
    """
    parts = package.split(".") if package else []
    if level > len(parts):
        return None
    base = parts[: len(parts) - level + 1]
    return ".".join([*base, name] if name else base)


class ActionKeys:
    """Computes action digests; module sources are read once and memoized."""

    def __init__(self, search_path: Sequence[str]) -> None:
        #: Only modules found under these folders count as project-local: the matrix's
        #: pythonpath, and cpmatrix's own package (its bundled cases and toolkit).
        self.roots = (*(os.path.abspath(p) for p in search_path), str(_PACKAGE_DIR))
        # The project's folders and the folder holding cpmatrix: never site-packages as a
        # whole (a wheel install puts cpmatrix there, beside torch).
        self.sources = ModuleSources((*self.roots[:-1], str(_PACKAGE_DIR.parent)),
                                     include_sys_path=False)
        self._closure: dict[str, str] = {}
        runtime = hashlib.sha256(__version__.encode())
        for name in _RUNTIME_MODULES:
            # Read from the package itself: the code the worlds run, wherever it is installed.
            runtime.update(_PACKAGE_DIR.joinpath(*name.split(".")[1:]).with_suffix(".py")
                           .read_bytes())
        self.runtime_digest = runtime.hexdigest()

    def _local(self, module: str) -> tuple[str, bytes] | None:
        try:
            path = self.sources.locate(module)
        except LookupError:
            return None
        if not any(path.startswith(root + os.sep) for root in self.roots):
            return None
        return path, self.sources.read(module)

    def module_closure_digest(self, module: str) -> str:
        """sha256 over the sources of ``module`` and its project-local imports."""
        hit = self._closure.get(module)
        if hit is not None:
            return hit
        seen: dict[str, bytes] = {}
        stack = [module]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            found = self._local(name)
            if found is None:
                continue
            path, source = found
            seen[name] = source
            # A submodule import also runs its parent packages' __init__.
            parts = name.split(".")
            stack.extend(".".join(parts[:i]) for i in range(1, len(parts)))
            stack.extend(_imports(source, name, path.endswith("__init__.py")))
        sources = {name: hashlib.sha256(source).hexdigest() for name, source in seen.items()}
        digest = hashlib.sha256(canonical_json(sources).encode()).hexdigest()
        self._closure[module] = digest
        return digest

    def digest(
        self, cell: Cell, *, runner_identity: Mapping[str, str], env: Mapping[str, str],
        toolchain: Mapping[str, str], mutant: str = "",
    ) -> str:
        module = cell.case.split(":", 1)[0]
        payload = {
            "cell": cell.digest,
            "closure": self.module_closure_digest(module),
            "runtime": self.runtime_digest,
            "runner": dict(runner_identity),
            "toolchain": dict(toolchain),
            "env": dict(env),
            "mutant": mutant,
        }
        return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


class ResultCache:
    """PASS results by action digest, one JSON file each under ``root/results``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, digest: str) -> Path:
        return self.root / "results" / digest[:2] / f"{digest}.json"

    def get(self, digest: str, cell_id: str) -> Result | None:
        path = self._path(digest)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            result = Result.from_dict(data["result"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # corrupt or foreign: ignored, rewritten by the next pass
        if data.get("digest") != digest or result.cell_id != cell_id:
            return None
        if result.status is not Status.PASSED:
            return None
        return replace(result, status=Status.CACHED,
                       message=f"(cached) passed at {data.get('stored_at', '?')}")

    def put(self, digest: str, result: Result) -> None:
        """Store a fresh PASS (anything else is ignored)."""
        if result.status is not Status.PASSED or result.mutant:
            return
        import time

        atomic_write_json(self._path(digest), {
            "digest": digest,
            "stored_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "result": result.to_dict(),
        })
