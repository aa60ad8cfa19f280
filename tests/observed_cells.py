"""One cell's reads, as a rank observes them (``ReadObserver.start``/``stop`` around the
cell's body): shared by the observer's unit tests and the child-process tests."""

from __future__ import annotations

from collections.abc import Callable

from cpmatrix.worker.observe import ReadObserver


def cell(obs: ReadObserver, body: Callable[[], object]) -> dict[str, str]:
    """The reads ``body`` made, path -> signature (never None: the observer was started)."""
    obs.start()
    try:
        body()
    finally:
        reads = obs.stop()
    assert reads is not None
    return reads
