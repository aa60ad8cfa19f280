"""Shared test setup: every test gets its own result cache, so no run reuses another's."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Module- and session-scoped fixtures run before the per-test fixture below: they too
    # must never read or fill the user's cache (~/.cache/cpmatrix).
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="cpmatrix-test-cache-")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Subprocesses (the real CLI) inherit this: cached passes never leak between tests.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
