"""The one place the pytest plugin calls cpmatrix's run.

:func:`run_tests` takes the cells of a pytest run and hands them to the run's front
door (:func:`cpmatrix.supervise.pipeline.execute_cells`), the steps ``cpmatrix run`` takes:
claim the output folder, prepare (runner, context, toolchain, cache), pack and run the
worlds, with Ctrl-C and SIGTERM stopping the worlds and the report written. Nothing else
in the front knows the run's parts.

A pytest run has no matrix file: the run gets one made in memory, with one platform
(gloo on the CPU, or nccl on the GPUs), the user's ``PYTHONPATH`` as its ``pythonpath``,
and the rootdir as its folder (the sandbox runner mounts it read-only).

Example::

    report = run_tests(cells, FrontSettings(out=Path(".cpmatrix"), rootdir=Path(".")),
                       platform=Platform(name="cpu", backend="gloo", device="cpu"),
                       on_result=show)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from cpmatrix.kinds.executors import EXECUTORS
from cpmatrix.matrix.schema import Cell, Matrix, Platform
from cpmatrix.result import Result
from cpmatrix.supervise.executors.spare import Spare
from cpmatrix.supervise.options import RunOptions
from cpmatrix.supervise.pipeline import Entry, RunReport, execute_cells
from cpmatrix.supervise.setup import children_pythonpath

__all__ = ["FrontSettings", "platform_for", "run_tests", "start_spare"]

#: Variables of the user's environment the ranks never see: the world sets its own (the
#: rank's identity, its home and temporary folders, the import path).
_WORLD_OWNS = frozenset({
    "HOME", "TMPDIR", "TMP", "TEMP", "PWD", "OLDPWD", "SHLVL", "_", "PYTHONPATH",
    "PYTHONSAFEPATH", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
    "PYTEST_CURRENT_TEST", "OMP_NUM_THREADS",
})
_WORLD_OWNS_PREFIXES = ("TORCHELASTIC_", "PYTEST_XDIST_", "CPMATRIX_WORLD")


@dataclass(frozen=True, kw_only=True)
class FrontSettings:
    """What ``--cpmatrix-*`` options ask of the run."""

    out: Path
    rootdir: Path
    #: The run's options (``--cpmatrix-runner``, ``--cpmatrix-world-ranks``, ...); the
    #: cache is off unless asked (``--cpmatrix-cache``): a pytest run runs its tests.
    options: RunOptions = field(default_factory=lambda: RunOptions(no_cache=True))
    #: The user's environment, passed to the ranks (less what the world owns).
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


def platform_for(device: str, env: Mapping[str, str], *, user_cache: bool = False) -> Platform:
    """The one platform of a pytest run: ``cpu`` (gloo) or ``cuda`` (nccl), with the
    user's environment for the ranks.

    ``user_cache``: the ranks use the user's cache folder (``$XDG_CACHE_HOME``, else
    ``~/.cache``) though each world has a ``HOME`` of its own: what a suite built there
    natively (torch's C++ extensions, DeepSpeed's ops: minutes to build) is found again.

    >>> platform_for("cpu", {"HOME": "/root", "MY_FLAG": "1", "RANK": "3"}).env
    (('MY_FLAG', '1'),)
    >>> platform_for("cpu", {"HOME": "/root"}, user_cache=True).env
    (('XDG_CACHE_HOME', '/root/.cache'),)
    """
    passed = tuple(sorted((k, v) for k, v in env.items() if k not in _WORLD_OWNS
                          and not k.startswith(_WORLD_OWNS_PREFIXES)))
    if user_cache and not env.get("XDG_CACHE_HOME") and env.get("HOME"):
        cache = os.path.join(env["HOME"], ".cache")
        passed = tuple(sorted((*passed, ("XDG_CACHE_HOME", cache))))
    if device == "cuda":
        return Platform(name="cuda", backend="nccl", device="cuda", env=passed)
    return Platform(name="cpu", backend="gloo", device="cpu", env=passed)


def run_tests(cells: Sequence[Cell], settings: FrontSettings, *, platform: Platform,
              on_result: Callable[[Entry, Result], None],
              on_start: Callable[[int], None] | None = None,
              spare: Spare | None = None) -> RunReport:
    """Run ``cells`` in cpmatrix's worlds; ``on_result`` sees each result as it comes;
    ``spare``: a launcher started earlier (:func:`start_spare`) for the first world.

    Raises :class:`~cpmatrix.errors.UsageError` for what cannot run here (the output
    folder in use, no GPU for cuda cells).
    """
    # No matrix file: the run's own, made here. Its folder is the rootdir.
    matrix = Matrix(path=str(settings.rootdir / "pytest"), version=1, platforms=(platform,),
                    targets=(), pythonpath=_pythonpath(settings.env))
    options = replace(settings.options, out=str(settings.out))
    return execute_cells(options, matrix, cells, on_result=on_result, on_start=on_start,
                         spare=spare, executors=EXECUTORS)


def _pythonpath(env: Mapping[str, str]) -> tuple[str, ...]:
    """The user's ``PYTHONPATH`` folders (those that exist), absolute: the run's own."""
    return tuple(os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep)
                 if p and os.path.isdir(p))


def start_spare(settings: FrontSettings, platform: Platform) -> Spare | None:
    """A fork launcher started now, for the run's first world (it imports torch while
    the plugin collects: :mod:`cpmatrix.supervise.executors.spare`); None where no world of
    this run could take it (another runner or launcher, a GPU platform)."""
    from cpmatrix.supervise.runners.local import LocalRunner

    options = settings.options
    if options.runner != LocalRunner.name or options.launcher != "fork" \
            or platform.device != "cpu":
        return None
    try:
        return Spare.start(options.python, os.environ, platform.env,
                           children_pythonpath(_pythonpath(settings.env)))
    except OSError:  # no spare: the world starts its launcher as usual
        return None
