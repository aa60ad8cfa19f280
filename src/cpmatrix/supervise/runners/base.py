"""The runner interface and the hermetic environment every cell gets.

Example::

    >>> env = hermetic_env({"PATH": "/usr/bin", "AWS_SECRET_ACCESS_KEY": "x"}, home="/h", tmp="/t")
    >>> "AWS_SECRET_ACCESS_KEY" in env, env["TZ"], env["HOME"]
    (False, 'UTC', '/h')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

__all__ = ["ENV_ALLOW", "Launch", "Runner", "hermetic_env"]

#: Variables passed from the caller's environment to a cell; nothing else is.
#: Secrets (tokens, keys, credentials) therefore never reach a cell, its logs or the report.
ENV_ALLOW: Final = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "VIRTUAL_ENV",
)


def hermetic_env(
    source: Mapping[str, str],
    *,
    home: str,
    tmp: str,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a cell: the allow-list from ``source`` plus fixed values."""
    env = {k: source[k] for k in ENV_ALLOW if k in source}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(
        {
            "TZ": "UTC",
            "HOME": home,
            "TMPDIR": tmp,
            "PYTHONHASHSEED": "0",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            # gloo picks an interface by resolving the host name; in a container or sandbox
            # with no network that stalls for minutes (FACTS.md). Loopback only, always.
            "GLOO_SOCKET_IFNAME": "lo",
            "MASTER_ADDR": "127.0.0.1",
            "OMP_NUM_THREADS": source.get("OMP_NUM_THREADS", "1"),
        }
    )
    if extra:
        env.update(extra)
    return env


@dataclass(frozen=True, kw_only=True)
class Launch:
    """A world's command and what it may touch."""

    #: The launcher's argv (:func:`~cpmatrix.supervise.executors.launch.launcher_argv`: the fork
    #: launcher or ``torch.distributed.run``, either running ``world_main`` in each rank).
    argv: tuple[str, ...]
    #: The complete environment for the command (already hermetic).
    env: dict[str, str]
    #: Working directory.
    cwd: str
    #: Directories the world may write (its output folder, private HOME/TMPDIR).
    writable: tuple[str, ...] = ()
    #: Directories the world reads (sources, the Python environment), mounted read-only.
    readonly: tuple[str, ...] = ()
    #: A unique name (used for container names).
    name: str = "cpmatrix"
    #: cuda device indices assigned to this world ('' for cpu).
    devices: tuple[int, ...] = field(default_factory=tuple)


class Runner(Protocol):
    """How a Launch is executed. Implementations live one per module in this package."""

    name: str
    #: True when worker pids are pids of this machine's namespace (may be signalled).
    shares_pid_namespace: bool
    #: True when the launched processes see files of their own (a container image) beside
    #: the launch's folders: a file they read that this machine lacks is covered by
    #: :meth:`identity`, not by the result cache's observed set.
    private_files: bool

    def unavailable(self) -> str | None:
        """None when usable here, else a one-line reason."""

    def command(self, launch: Launch) -> tuple[list[str], dict[str, str]]:
        """The argv to exec and the environment to exec it with."""

    def identity(self) -> dict[str, str]:
        """What about this runner enters a cell's digest (e.g. the image digest)."""

    def cleanup(self, launch: Launch) -> None:
        """Called after the launched process group was killed (e.g. kill a container)."""
