"""The local runner: the world's launcher as a plain subprocess with the hermetic environment.

Example::

    >>> LocalRunner().command(Launch(argv=("python", "-V"), env={"TZ": "UTC"}, cwd="/"))
    (['python', '-V'], {'TZ': 'UTC'})
"""

from __future__ import annotations

from cpmatrix.supervise.runners.base import Launch

__all__ = ["LocalRunner"]


class LocalRunner:
    """The world's launcher as a plain subprocess with the hermetic environment."""

    name = "local"
    shares_pid_namespace = True
    private_files = False

    def unavailable(self) -> str | None:
        return None

    def command(self, launch: Launch) -> tuple[list[str], dict[str, str]]:
        return list(launch.argv), dict(launch.env)

    def identity(self) -> dict[str, str]:
        return {"runner": "local"}

    def cleanup(self, launch: Launch) -> None:
        return None
