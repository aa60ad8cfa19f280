"""Content digests: what a cell's result depends on, as one sha256.

A cell's digest covers its own spec, the bytes of its case module's source and its
platform's spec, so editing one case module changes only that module's cells.
Module sources are found without importing anything (no torch at list time).

Example::

    >>> sources = ModuleSources(("tests/resources/cases",))   # doctest: +SKIP
    >>> cell_digest({"id": "x"}, sources.read("demo_cases"), {"name": "cpu"})  # doctest: +SKIP
    '3f1c...'
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "ModuleSources",
    "canonical_json",
    "cell_digest",
    "cell_digest_from_parts",
    "sha256_hex",
]

# One encoder for every call: json.dumps builds a new one per call when given options,
# which was a third of the time of expanding a 10,000-cell matrix.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


def canonical_json(value: object) -> str:
    """JSON with sorted keys and no whitespace: equal values give equal text."""
    return _CANONICAL.encode(value)


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def cell_digest(spec: dict[str, object], source: bytes, platform: dict[str, object]) -> str:
    """sha256 over the cell's spec, its case module's source bytes and its platform."""
    return cell_digest_from_parts(
        canonical_json(spec), hashlib.sha256(source).digest(), canonical_json(platform)
    )


def cell_digest_from_parts(spec_json: str, source_sha256: bytes, platform_json: str) -> str:
    """:func:`cell_digest` with the per-module and per-platform parts computed once.

    ``source_sha256`` is ``hashlib.sha256(source).digest()``; the JSON texts are
    :func:`canonical_json` of the spec and the platform. Same result as ``cell_digest``.
    """
    h = hashlib.sha256()
    h.update(b"cpmatrix-cell-v1\0")
    h.update(spec_json.encode())
    h.update(b"\0")
    h.update(source_sha256)
    h.update(b"\0")
    h.update(platform_json.encode())
    return h.hexdigest()


class ModuleSources:
    """Finds a module's source file on a search path and reads it, cached by name."""

    def __init__(self, search_path: Sequence[str] = (), *, include_sys_path: bool = True) -> None:
        extra = tuple(p for p in sys.path if p) if include_sys_path else ()
        self.search_path = tuple(search_path) + extra
        self._cache: dict[str, tuple[str, bytes]] = {}

    def locate(self, module: str) -> str:
        """The file of ``module`` (``pkg/mod.py`` or ``pkg/mod/__init__.py``)."""
        return self._get(module)[0]

    def read(self, module: str) -> bytes:
        return self._get(module)[1]

    def _get(self, module: str) -> tuple[str, bytes]:
        hit = self._cache.get(module)
        if hit is not None:
            return hit
        rel = Path(*module.split("."))
        for base in self.search_path:
            for candidate in (Path(base, rel).with_suffix(".py"), Path(base, rel, "__init__.py")):
                if candidate.is_file():
                    path = os.path.abspath(candidate)
                    found = (path, candidate.read_bytes())
                    self._cache[module] = found
                    return found
        raise LookupError(f"module {module!r} not found on the search path")
