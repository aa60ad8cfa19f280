"""The result cache's section of a run's settings: off, where, and the remote layer.

Example::

    >>> CacheSettings(no_cache=True).remote_cache is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CacheSettings"]


@dataclass(frozen=True, kw_only=True, slots=True)
class CacheSettings:
    """The result cache: off, where, and the remote layer (``--no-cache``, ...)."""

    no_cache: bool = False
    cache_dir: str | None = None
    remote_cache: str | None = None
    remote_cache_read_only: bool = False
