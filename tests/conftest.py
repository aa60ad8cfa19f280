"""Shared test setup: every test gets its own result cache, so no run reuses another's."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_runner import reap_started


def pytest_configure(config: pytest.Config) -> None:
    # Module- and session-scoped fixtures run before the per-test fixture below: they too
    # must never read or fill the user's cache (~/.cache/cpmatrix).
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="cpmatrix-test-cache-")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Subprocesses (the real CLI) inherit this: cached passes never leak between tests.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture(autouse=True)
def _no_run_outlives_its_test() -> Iterator[None]:
    # A test that failed before waiting for a run it started (a timeout in wait_for)
    # would leave it holding the cores, and its Popen's ResourceWarning would fail
    # whichever test runs when it is collected.
    yield
    reap_started()
