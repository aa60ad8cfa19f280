"""Bazel-style result cache: a PASS is stored under the cell's action key, with the content
hashes of everything the cell was seen to read; a lookup re-hashes them.

The key has two halves (docs/cache.md says what each covers):

- the **static pre-key** (:meth:`ActionKeys.digest`), known before anything runs: the
  cell's source digest (:meth:`ActionKeys.source_digest`: the cell digest, i.e. its spec,
  its case module's source and its platform; the source of every project-local module
  the case module imports, transitively, found by reading ``import`` statements without
  importing anything; cpmatrix's version and the source of every cpmatrix module that
  runs in a world: the import closure of the world-side entry points), the runner's
  identity (the image id in a container), the interpreter that runs the worlds, its
  distributions and its site configuration (:mod:`cpmatrix.cache.toolchain`), the
  environment allow-list and the platform's environment, the mutant, the machine's
  hardware and stack identity (:mod:`cpmatrix.cache.machine`);
- the **observed set** (:mod:`cpmatrix.worker.observe`): every file and folder the cell
  read on any rank, outside the standard library and non-editable distributions' RECORDs,
  however it was read (an editable install, ``importlib``, a folder added to
  ``sys.path``, a ``.pth`` path, a data file, a module an earlier cell loaded). Stored as
  content hashes (:class:`ReadHashes`); a lookup re-hashes each one, and any difference
  (or a file now present that was absent) reruns the cell.

Only first-attempt passes are stored: failures, flaky results (a pass that needed a
retry), timeouts and mutant runs never are; nor a pass whose observed set is unknown or
changed while the run read it. Entries are written atomically, so concurrent runs can
share a cache folder; an entry that is corrupt, of another format or of another key is
ignored (and rewritten by the next pass).

The entry (format ``cpmatrix-cache/3``; one JSON file per pre-key, at
``root/results/<key[:2]>/<key>.json``; a remote cache stores the same JSON as the
action's one output, :mod:`cpmatrix.cache.layers`)::

    {"format": "cpmatrix-cache/3", "key": "<pre-key, 64 hex>", "stored_at": "<UTC>Z",
     "reads": {"$project/cases/ring.py": "sha256:<hex>" | "ls:<hex>" | "py:<hex>" |
               "absent", ...},
     "result": {...Result.to_dict()...}}

``sha256:`` is a file's content, ``ls:`` the sorted names of a folder the cell listed,
``py:`` the sorted importable names of a folder imports search (``.py``, packages,
extension modules, ``.pth``), ``absent`` a path the cell looked for and did not find.
Paths under the project or the interpreter's prefix are written ``$project/...``,
``$prefix/...`` (:mod:`cpmatrix.cache.portable`), checked against this checkout's folders.

Example::

    >>> keys = ActionKeys(search_path=("tests/resources/cases",))       # doctest: +SKIP
    >>> cache = ResultCache(Path("~/.cache/cpmatrix").expanduser())      # doctest: +SKIP
    >>> cache.get(keys.digest(cell, runner_identity={}, env={}), cell.id)  # doctest: +SKIP
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Final

from cpmatrix import __version__
from cpmatrix.cache.portable import NO_ANCHORS, Anchors
from cpmatrix.digest import ModuleSources, canonical_json
from cpmatrix.fsutil import atomic_write_json
from cpmatrix.matrix.schema import Cell
from cpmatrix.module_names import WORKER_ENTRIES
from cpmatrix.paths import PACKAGE_DIR
from cpmatrix.result import Result, Status
from cpmatrix.worker.follow import UNOBSERVED, merge_signatures
from cpmatrix.worker.observe import ABSENT, CHANGED, importable, signature

__all__ = ["FORMAT", "WORKER_ENTRIES", "ActionKeys", "ReadHashes", "ResultCache",
           "default_cache_dir", "merge_reads", "storable"]

#: The entry format this version writes and reads (older entries are misses).
FORMAT: Final = "cpmatrix-cache/3"
#: cpmatrix's package folder (``.../cpmatrix``), from a checkout or a wheel alike.
_PACKAGE_DIR = PACKAGE_DIR


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
    """Computes source digests and action keys; module sources are read once, memoized."""

    def __init__(self, search_path: Sequence[str]) -> None:
        #: Only modules found under these folders count as project-local: the matrix's
        #: pythonpath, and cpmatrix's own package (its bundled cases and toolkit).
        self.roots = (*(os.path.abspath(p) for p in search_path), str(_PACKAGE_DIR))
        # The project's folders and the folder holding cpmatrix: never site-packages as a
        # whole (a wheel install puts cpmatrix there, beside torch).
        self.sources = ModuleSources((*self.roots[:-1], str(_PACKAGE_DIR.parent)),
                                     include_sys_path=False)
        self._closure: dict[str, str] = {}
        self._source: dict[tuple[str, str, str], str] = {}
        # Read from the package itself: the code the worlds run, wherever it is installed.
        runtime = [__version__, *(self.module_closure_digest(name) for name in WORKER_ENTRIES)]
        self.runtime_digest = hashlib.sha256(canonical_json(runtime).encode()).hexdigest()

    def _local(self, module: str) -> tuple[str, bytes] | None:
        try:
            path = self.sources.locate(module)
        except LookupError:
            return None
        if not any(path.startswith(root + os.sep) for root in self.roots):
            return None
        return path, self.sources.read(module)

    def closure_sources(self, module: str) -> dict[str, str]:
        """The files of ``module`` and its project-local imports: module name -> path.

        >>> sorted(ActionKeys(search_path=()).closure_sources("cpmatrix.fsutil"))
        ['cpmatrix', 'cpmatrix.fsutil']
        """
        seen: dict[str, str] = {}
        stack = [module]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            found = self._local(name)
            if found is None:
                continue
            path, source = found
            seen[name] = path
            # A submodule import also runs its parent packages' __init__.
            parts = name.split(".")
            stack.extend(".".join(parts[:i]) for i in range(1, len(parts)))
            stack.extend(_imports(source, name, path.endswith("__init__.py")))
        return seen

    def module_closure_digest(self, module: str) -> str:
        """sha256 over the sources of ``module`` and its project-local imports."""
        hit = self._closure.get(module)
        if hit is not None:
            return hit
        sources = {name: hashlib.sha256(self.sources.read(name)).hexdigest()
                   for name in self.closure_sources(module)}
        digest = hashlib.sha256(canonical_json(sources).encode()).hexdigest()
        self._closure[module] = digest
        return digest

    def source_digest(self, cell: Cell) -> str:
        """What the cell's code is: the cell digest (spec, case module, platform), the
        closure of the case module's project-local imports and cpmatrix's world-side
        source. Recorded with every result; ``merge`` and ``gate`` compare it."""
        key = (cell.digest, cell.case, self.runtime_digest)
        hit = self._source.get(key)
        if hit is None:
            # The cell, its imports, cpmatrix's world-side code (in this order).
            parts = [cell.digest, self.module_closure_digest(cell.case.split(":", 1)[0]),
                     self.runtime_digest]
            hit = hashlib.sha256(canonical_json(parts).encode()).hexdigest()
            self._source[key] = hit
        return hit

    def digest(
        self, cell: Cell, *, runner_identity: Mapping[str, str], env: Mapping[str, str],
        toolchain: Mapping[str, str], mutant: str = "",
        machine: Mapping[str, str] | None = None,
    ) -> str:
        """The static pre-key: the cell's source digest and where and how it runs,
        on what machine (:mod:`cpmatrix.cache.machine`: ISA flags, GPU, driver, ...)."""
        payload = {
            "source": self.source_digest(cell),
            "runner": dict(runner_identity),
            "toolchain": dict(toolchain),
            "env": dict(env),
            "mutant": mutant,
            "machine": dict(machine or {}),
        }
        return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def merge_reads(per_rank: Sequence[Mapping[str, str] | None]) -> dict[str, str] | None:
    """The observed sets of a cell's ranks as one: a path two ranks saw with different
    signatures (it changed between their reads) is ``CHANGED``, unless one of them is an
    unobservable start (``?``: why), which stays; None when some rank's set is unknown
    (not observed).

    >>> merge_reads([{"a": "f:1", "b": "-"}, {"a": "f:1", "c": "f:2"}])
    {'a': 'f:1', 'b': '-', 'c': 'f:2'}
    >>> merge_reads([{"a": "f:1"}, {"a": "f:2"}]), merge_reads([{"a": "f:1"}, None])
    ({'a': '!'}, None)
    >>> merge_reads([{"s": "?it ran cat"}, {"s": "?it ran ls"}])
    {'s': '?it ran cat'}
    """
    merged: dict[str, str] = {}
    for reads in per_rank:
        if reads is None:
            return None
        for path, sig in reads.items():
            merged[path] = merge_signatures(merged.setdefault(path, sig), sig)
    return merged


#: A folder's signature kind -> the digest prefix that names what is hashed of it.
_KIND_PREFIX: Final = {"f": "sha256:", "d": "ls:", "p": "py:"}


def _signature_kind(kind: str) -> str:
    """What ``stat`` says a path of an observed ``kind`` is: a file, or a folder (a listed
    folder ``d`` and a folder imports search ``p`` are both folders).

    >>> [_signature_kind(k) for k in ("f", "d", "p")]
    ['f', 'd', 'd']
    """
    return "f" if kind == "f" else "d"


class ReadHashes:
    """Content hashes of observed paths, each computed once per signature.

    A hash is remembered with the signature the path had when it was read, and reused
    only while the path keeps that signature: a file edited during the run is hashed
    again, never served from memory.
    """

    def __init__(self) -> None:
        self._memo: dict[tuple[str, str], tuple[str, str]] = {}
        #: Paths whose hash was computed (not remembered): for the figures.
        self.hashed = 0

    def digest(self, path: str, kind: str) -> str:
        """``sha256:`` (file, ``kind`` f), ``ls:`` (folder listing, d), ``py:`` (importable
        names, p) of what ``path`` holds now; ``absent`` when there is nothing there (or
        not of that kind: a folder where a file was is not that file)."""
        now = signature(path)
        remembered = self._memo.get((path, kind))
        if remembered is not None and remembered[0] == now:
            return remembered[1]
        value = self._compute(path, kind, now)
        if signature(path) == now:  # unchanged while it was read: safe to remember
            self._memo[(path, kind)] = (now, value)
        return value

    def _compute(self, path: str, kind: str, now: str) -> str:
        if now == ABSENT or _signature_kind(kind) != now[0]:
            return "absent"
        self.hashed += 1
        try:
            if kind == "f":
                with open(path, "rb") as f:
                    return "sha256:" + hashlib.file_digest(f, hashlib.sha256).hexdigest()
            names = sorted(n for n in os.listdir(path) if kind == "d" or importable(n))
        except OSError as exc:
            return f"unreadable:{type(exc).__name__}"
        return _KIND_PREFIX[kind] + hashlib.sha256("\n".join(names).encode()).hexdigest()

    def settle(self, reads: Mapping[str, str], *, private_files: bool = False,
               ) -> dict[str, str] | str:
        """The content hashes of a cell's observed set, checked against the signatures the
        ranks saw; a reason (str) when it cannot be stored: a path that changed since a
        rank read it, or while the cell ran.

        ``private_files``: the ranks see files of their own (a container image) beside
        the shared folders; a file they saw that is not here is the image's, which the
        runner's identity covers.
        """
        for _, sig in sorted(reads.items()):
            if sig.startswith(UNOBSERVED):  # a process the cell started was not followed
                return sig[len(UNOBSERVED):]
        hashes: dict[str, str] = {}
        for path, sig in sorted(reads.items()):
            if sig == CHANGED:
                return f"{path} changed while the cell ran"
            now = signature(path)
            if sig == ABSENT:  # looked for, not found: it must still not be there
                if now != ABSENT:
                    return f"{path} changed after the cell read it"
                hashes[path] = "absent"
                continue
            if sig[0] not in _KIND_PREFIX:
                return f"{path}: unknown signature {sig!r}"
            kind = sig[0]
            if now == ABSENT and private_files:
                continue
            # A rank's "d"/"p" folder is a folder here ("d" to stat): same signature.
            if now != _signature_kind(kind) + sig[1:]:
                return f"{path} changed after the cell read it"
            value = self.digest(path, kind)
            if signature(path) != now:
                return f"{path} changed while it was hashed"
            hashes[path] = value
        return hashes

    def matches(self, path: str, stored: str) -> bool:
        """Whether ``path`` still holds what ``stored`` (an entry's hash) says."""
        if stored == "absent":
            return signature(path) == ABSENT
        for kind, prefix in _KIND_PREFIX.items():
            if stored.startswith(prefix):
                return self.digest(path, kind) == stored
        return False  # an unknown kind: never a hit


def storable(result: Result) -> bool:
    """Whether ``result`` may become a cached pass, locally or remotely: a fresh
    first-attempt PASS of an unmutated cell (never a failure, a FLAKY pass, a pass that
    needed a retry, or a mutant run). The one rule both caches use.

    >>> ok = Result(cell_id="c", status=Status.PASSED)
    >>> storable(ok), storable(replace(ok, attempts=2)), storable(replace(ok, mutant="m"))
    (True, False, False)
    >>> storable(replace(ok, status=Status.FLAKY)), storable(replace(ok, status=Status.CACHED))
    (False, False)
    """
    return result.status is Status.PASSED and not result.mutant and result.attempts == 1


class ResultCache:
    """First-attempt PASS results by pre-key, each with its observed set's hashes, one JSON
    file each under ``root/results``.

    ``anchors``: the roots its paths are written against (:mod:`cpmatrix.cache.portable`),
    so an entry stored from one checkout is checked against another's files.
    """

    def __init__(self, root: Path, hashes: ReadHashes | None = None,
                 anchors: Anchors = NO_ANCHORS) -> None:
        self.root = root
        self.hashes = hashes if hashes is not None else ReadHashes()
        self.anchors = anchors

    def _path(self, key: str) -> Path:
        return self.root / "results" / key[:2] / f"{key}.json"

    def get(self, key: str, cell_id: str) -> Result | None:
        """The stored pass, marked cached, when every file it read still holds what it
        held; None otherwise (a miss: the cell runs)."""
        data = self.read(key)
        if data is None:
            return None
        found = self.check(data, key, cell_id)
        return found if isinstance(found, Result) else None

    def read(self, key: str) -> object:
        """The entry stored for ``key`` as parsed JSON, unchecked (:meth:`check` judges
        it); None when there is none, or it is corrupt or foreign (rewritten by the next
        pass)."""
        try:
            return json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def check(self, data: object, key: str, cell_id: str) -> Result | str:
        """An entry (parsed JSON, from this folder or a remote cache) as a cached pass of
        ``cell_id`` under ``key``, when every file it read still holds what it held here;
        else why not (a miss)."""
        if not isinstance(data, dict):
            return "the entry does not parse"
        try:
            result = Result.from_dict(data["result"])
            reads = data["reads"]
        except (ValueError, KeyError, TypeError, AttributeError):
            return "the entry does not parse"
        if data.get("format") != FORMAT or data.get("key") != key or \
                result.cell_id != cell_id or result.status is not Status.PASSED or \
                not isinstance(reads, dict):
            return "the entry is of another format, key or cell, or not a pass"
        for file, stored in reads.items():
            if not isinstance(stored, str) or \
                    not self.hashes.matches(self.anchors.local(str(file)), stored):
                return f"{file} does not hold what the cell read"
        return replace(result, status=Status.CACHED,
                       message=f"(cached) passed at {data.get('stored_at', '?')}")

    def entry(self, key: str, result: Result, reads: Mapping[str, str],
              ) -> dict[str, object] | None:
        """The entry for a fresh first-attempt PASS (:func:`storable`) with the hashes of
        what it read, paths written against the anchors; None for anything else."""
        if not storable(result):
            return None
        return {
            "format": FORMAT,
            "key": key,
            "stored_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "reads": dict(sorted((self.anchors.portable(p), h) for p, h in reads.items())),
            "result": result.to_dict(),
        }

    def write(self, key: str, entry: Mapping[str, object]) -> None:
        """Store ``entry`` (atomically) as this folder's entry for ``key``."""
        atomic_write_json(self._path(key), dict(entry))

    def put(self, key: str, result: Result, reads: Mapping[str, str]) -> bool:
        """Store a fresh first-attempt PASS with the hashes of what it read (anything
        else is ignored); True when stored."""
        entry = self.entry(key, result, reads)
        if entry is None:
            return False
        self.write(key, entry)
        return True
