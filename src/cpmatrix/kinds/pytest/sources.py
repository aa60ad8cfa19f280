"""The sources a collected test depends on, as one sha256 (part of its cells' digests).

A test's result depends on its file, the ``conftest.py`` files pytest loads for it (the
file's folder and every folder above it up to the rootdir), the rootdir's ini files, and
the project's own modules the file imports, transitively. Those are found by reading
``import`` statements (nothing is imported here) and looking each name up under the
project's folders: the rootdir and the folders of ``sys.path`` inside it. Installed
packages are not sources: the interpreter's identity covers them (``cache/toolchain.py``).

Example::

    >>> d = SourceDigests(rootdir="/nonexistent")
    >>> len(d.digest("/nonexistent/test_x.py"))
    64
"""

from __future__ import annotations

import ast
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from cpmatrix.digest import canonical_json

__all__ = ["INI_FILES", "SourceDigests", "imported_names"]

#: The files pytest reads its settings from, at the rootdir.
INI_FILES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")


def imported_names(source: bytes, package: str) -> list[str]:
    """Absolute module names ``source`` imports (``from x import y`` also names ``x.y``).

    >>> imported_names(b"import os\\nfrom .helper import f", "pkg")
    ['os', 'pkg.helper', 'pkg.helper.f']
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                if node.level > len(parts) + 1:
                    continue
                base = parts[: len(parts) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            if mod:
                names.append(mod)
                names.extend(f"{mod}.{a.name}" for a in node.names if a.name != "*")
    return names


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


class SourceDigests:
    """Digests of tests' sources under one rootdir; each file is read and parsed once, and
    each test file's digest made once (the tests of one file share it)."""

    def __init__(self, rootdir: str, sys_path: Sequence[str] = ()) -> None:
        self.rootdir = Path(rootdir).resolve()
        root = str(self.rootdir)
        inside = [Path(p).resolve() for p in sys_path
                  if p and (os.path.realpath(p) + os.sep).startswith(root + os.sep)]
        self.roots = list(dict.fromkeys([*inside, self.rootdir]))
        self._hash: dict[Path, str] = {}
        self._imports: dict[tuple[Path, str], list[str]] = {}
        self._digest: dict[Path, str] = {}

    def _file_hash(self, path: Path) -> str | None:
        if path not in self._hash:
            data = _read(path)
            if data is None:
                return None
            self._hash[path] = hashlib.sha256(data).hexdigest()
        return self._hash[path]

    def _locate(self, module: str, bases: Sequence[Path]) -> Path | None:
        rel = Path(*module.split("."))
        for base in bases:
            for candidate in (base / rel.with_suffix(".py"), base / rel / "__init__.py"):
                if candidate.is_file():
                    return candidate.resolve()
        return None

    def _basedir(self, file: Path) -> tuple[Path, str]:
        """The folder pytest puts on ``sys.path`` for ``file`` (the first one up without
        an ``__init__.py``) and the file's package name there."""
        parts: list[str] = []
        folder = file.parent
        while (folder / "__init__.py").is_file() and folder != folder.parent:
            parts.insert(0, folder.name)
            folder = folder.parent
        return folder, ".".join(parts)

    def digest(self, file: str) -> str:
        """sha256 over the test file, its conftests, the ini files and its local imports."""
        start = Path(file).resolve()
        if start not in self._digest:
            self._digest[start] = self._make_digest(start)
        return self._digest[start]

    def _names(self, path: Path, pkg: str) -> list[str]:
        if (path, pkg) not in self._imports:
            self._imports[path, pkg] = imported_names(_read(path) or b"", pkg)
        return self._imports[path, pkg]

    def _make_digest(self, start: Path) -> str:
        basedir, package = self._basedir(start)
        bases = [basedir, *self.roots]
        seen: dict[str, str] = {}
        stack: list[tuple[Path, str]] = [(start, package)]
        folder = start.parent
        while True:
            stack.append((folder / "conftest.py", ""))
            if folder == self.rootdir or folder == folder.parent:
                break
            folder = folder.parent
        for name in INI_FILES:
            h = self._file_hash(self.rootdir / name)
            if h is not None:
                seen[name] = h
        while stack:
            path, pkg = stack.pop()
            key = str(path)
            if key in seen:
                continue
            h = self._file_hash(path)
            if h is None:
                continue
            seen[key] = h
            if path.suffix != ".py":
                continue
            for name in self._names(path, pkg):
                found = self._locate(name, bases)
                if found is not None and str(found) not in seen:
                    own = name.rpartition(".")[0] if found.name != "__init__.py" else name
                    stack.append((found, own))
        rel = {os.path.relpath(k, self.rootdir) if os.path.isabs(k) else k: v
               for k, v in seen.items()}
        return hashlib.sha256(canonical_json(rel).encode()).hexdigest()
