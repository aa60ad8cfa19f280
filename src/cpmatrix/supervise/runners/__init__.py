"""Runners: how a world's process tree is isolated (local, sandbox, docker).

Each runner turns a :class:`~cpmatrix.supervise.runners.base.Launch` into the argv to exec.
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
from pathlib import Path
from typing import Final

from cpmatrix.errors import UsageError
from cpmatrix.matrix.schema import IMAGE_FORMS, Platform, image_form
from cpmatrix.supervise.runners.base import ENV_ALLOW, Launch, Runner, hermetic_env
from cpmatrix.supervise.runners.docker import DockerRunner
from cpmatrix.supervise.runners.local import LocalRunner
from cpmatrix.supervise.runners.sandbox import SandboxRunner

__all__ = ["ENV_ALLOW", "Launch", "Runner", "get_runner", "hermetic_env", "resolve_runner",
           "runner_names"]

def _docker(platform: Platform | None, base_dir: Path) -> Runner:
    """The platform's image: built from its Dockerfile, or the reference it names."""
    device = platform.device if platform else "cpu"
    if platform is None or platform.image is None:
        return DockerRunner(device=device)
    if image_form(platform.image) == "reference":
        return DockerRunner(image=platform.image, device=device)
    return DockerRunner(dockerfile=(base_dir / platform.image).resolve(), device=device)


#: name -> factory(platform, the matrix file's folder).
_RUNNERS: Final[dict[str, Callable[[Platform | None, Path], Runner]]] = {
    "local": lambda platform, base_dir: LocalRunner(),
    "sandbox": lambda platform, base_dir: SandboxRunner(
        device=platform.device if platform else "cpu"),
    "docker": _docker,
}


def runner_names() -> tuple[str, ...]:
    return tuple(_RUNNERS)


def get_runner(name: str, platform: Platform | None = None,
               base_dir: str | Path = ".") -> Runner:
    """The runner called ``name`` for ``platform`` (``image:`` relative to ``base_dir``,
    the matrix file's folder); ValueError for an unknown runner."""
    try:
        factory = _RUNNERS[name]
    except KeyError:
        raise ValueError(f"unknown runner {name!r} (allowed: {', '.join(_RUNNERS)})") from None
    return factory(platform, Path(base_dir))


def _no_image(platform: Platform) -> str | None:
    """Why the docker runner cannot run ``platform`` (it runs the platform's image), or None."""
    if platform.image is not None:
        return None
    where = f" ({platform.where})" if platform.where else ""
    return f"platform {platform.name!r} declares no image{where}"


def resolve_runner(name: str, platform: Platform,
                   base_dir: str | Path = ".") -> tuple[Runner, str]:
    """The runner called ``name`` (``auto``: docker > sandbox > local) and why it was chosen.

    Raises UsageError when the named runner cannot run here.
    """
    no_image = _no_image(platform)
    if name == "docker" and no_image:
        raise UsageError(f"--runner docker: {no_image}; add `image:` to it ({IMAGE_FORMS}), "
                         "or choose --runner local or sandbox")
    if name != "auto":
        try:
            runner = get_runner(name, platform, base_dir)
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
            runner = get_runner(candidate, platform, base_dir)
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
