"""A real nginx WebDAV cache server for the tests (tools/cache_server.py, loaded by path).

Tests that need it skip when nginx is not installed, except under
``CPMATRIX_REQUIRE_CACHE_SERVER=1`` (CI, after ``.ci/cache-up``), where they fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from script_modules import load_script

ROOT = Path(__file__).resolve().parent.parent


cache_server = load_script("tools/cache_server.py", "cache_server")


def need_nginx() -> None:
    if cache_server.available():
        return
    if os.environ.get("CPMATRIX_REQUIRE_CACHE_SERVER") == "1":
        pytest.fail("nginx is missing but CPMATRIX_REQUIRE_CACHE_SERVER=1 (run .ci/cache-up)")
    pytest.skip("nginx is not installed (apt-get install nginx, or run .ci/cache-up)")


def serve(root: Path, **kwargs: object) -> Iterator[object]:
    """A server under ``root`` for the duration of a fixture."""
    need_nginx()
    server = cache_server.start(root, **kwargs)
    try:
        yield server
    finally:
        server.stop()
