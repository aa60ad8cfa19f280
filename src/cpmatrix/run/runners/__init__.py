"""Runners: how a world's process tree is isolated (local, sandbox, docker).

Each runner turns a :class:`~cpmatrix.run.runners.base.Launch` into the argv to exec.
The supervisor owns the process; a runner only shapes the command and cleans up what
outlives a killed process group (a container). This module is the registry: the one place
that knows every runner, and the ``auto`` choice among them.

Example::

    >>> runner_names()
    ('local', 'sandbox', 'docker')
    >>> get_runner("local").name
    'local'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from cpmatrix.errors import UsageError
from cpmatrix.matrix.schema import Platform
from cpmatrix.run.runners.base import ENV_ALLOW, Launch, Runner, hermetic_env
from cpmatrix.run.runners.docker import DockerRunner
from cpmatrix.run.runners.local import LocalRunner
from cpmatrix.run.runners.sandbox import SandboxRunner

__all__ = ["ENV_ALLOW", "Launch", "Runner", "get_runner", "hermetic_env", "resolve_runner",
           "runner_names"]

#: name -> factory taking the platform name. ``auto`` tries them in this order, after
#: docker and sandbox are checked for being usable here.
_RUNNERS: Final[dict[str, Callable[[str], Runner]]] = {
    "local": lambda platform: LocalRunner(),
    "sandbox": lambda platform: SandboxRunner(platform=platform),
    "docker": lambda platform: DockerRunner(platform=platform),
}


def runner_names() -> tuple[str, ...]:
    return tuple(_RUNNERS)


def get_runner(name: str, platform: str = "cpu") -> Runner:
    """The runner called ``name`` for ``platform``; ValueError for an unknown one."""
    try:
        factory = _RUNNERS[name]
    except KeyError:
        raise ValueError(f"unknown runner {name!r} (allowed: {', '.join(_RUNNERS)})") from None
    return factory(platform)


def _no_image(platform: Platform) -> str | None:
    """Why the docker runner cannot run ``platform`` (it runs the platform's image), or None."""
    if platform.image is not None:
        return None
    where = f" ({platform.where})" if platform.where else ""
    return f"platform {platform.name!r} declares no image{where}"


def resolve_runner(name: str, platform: Platform) -> tuple[Runner, str]:
    """The runner called ``name`` (``auto``: docker > sandbox > local) and why it was chosen.

    Raises UsageError when the named runner cannot run here.
    """
    no_image = _no_image(platform)
    if name == "docker" and no_image:
        raise UsageError(f"--runner docker: {no_image}; add `image: docker/{platform.name}"
                         ".Dockerfile` to it, or choose --runner local or sandbox")
    if name != "auto":
        try:
            runner = get_runner(name, platform=platform.name)
        except (ValueError, ImportError) as exc:
            raise UsageError(str(exc)) from None
        why_not = runner.unavailable()
        if why_not:
            raise UsageError(f"--runner {name}: {why_not}")
        return runner, "chosen with --runner"
    reasons = []
    for candidate in ("docker", "sandbox"):
        if candidate == "docker" and no_image:
            reasons.append(f"docker: {no_image}")
            continue
        try:
            runner = get_runner(candidate, platform=platform.name)
        except (ValueError, ImportError) as exc:
            reasons.append(f"{candidate}: {exc}")
            continue
        why_not = runner.unavailable()
        if why_not is None:
            what = "a Docker engine answers and the image is built" if candidate == "docker" \
                else "bubblewrap works here"
            return runner, f"auto: {what}" + (f"; skipped {'; '.join(reasons)}" if reasons else "")
        reasons.append(f"{candidate}: {why_not}")
    return get_runner("local"), "auto: " + "; ".join(reasons)
