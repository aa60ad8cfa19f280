"""Every setting of a run in one place: :class:`RunOptions`, each field with its flag.

The command line is generated from the fields (:func:`add_run_arguments`), so a setting
cannot exist without its flag and its documentation, and ``cpmatrix run``, ``cpmatrix
spill``, ``repro`` and the nox sessions read the same object.

Paths are resolved once, when the options are made (at parse time): ``--out``,
``--cache-dir`` and ``--durations-from`` become absolute (relative to the folder cpmatrix was
started in), and ``--python`` becomes the absolute path of an executable file (a bare
name is looked up on ``PATH``), or the options are refused (exit 2) naming it. Worlds
start in folders of their own, where a relative path would name another file.

Example::

    >>> import argparse
    >>> p = argparse.ArgumentParser()
    >>> add_run_arguments(p)
    >>> opts = RunOptions.from_namespace(p.parse_args(["--jobs", "2", "--abort-grace", "3"]))
    >>> opts.jobs, opts.abort_grace_s, opts.teardown_grace_s
    (2, 3.0, 20.0)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from cpmatrix.defaults import LAUNCHER, RUNNER
from cpmatrix.errors import UsageError
from cpmatrix.plan.balance import parse_shard
from cpmatrix.plan.ordering import parse_order
from cpmatrix.plan.settings import PLAN_DEFAULTS, PlanSettings
from cpmatrix.supervise.settings import (
    CacheSettings,
    FaultTimings,
    Launcher,
    Packing,
    RunnerChoice,
    SchedulerName,
    SlurmSettings,
    choices,
)

__all__ = ["LAUNCHERS", "PACKINGS", "RunOptions", "add_pytest_options", "add_run_arguments",
           "pytest_flag", "pytest_values", "resolve_interpreter"]

#: How a world's ranks are started (see docs/worlds.md for the measured choice).
LAUNCHERS = choices(Launcher)
#: How a world places its cells on its ranks (see docs/worlds.md).
PACKINGS = choices(Packing)
#: The sections' defaults, which the flags' defaults are (each defined once, there).
_TIMINGS = FaultTimings()
_SLURM = SlurmSettings()
_CACHE = CacheSettings()


def _flag(flag: str, help: str, *, pytest: tuple[str, str] | None = None,
          **argparse_kwargs: Any) -> dict[str, Any]:
    """A field's flag: its name, help and argparse arguments; ``pytest``: its name and
    help on the pytest front too (the same type, choices, metavar and default)."""
    return {"flag": flag, "help": help, "argparse": argparse_kwargs, "pytest": pytest}


def pytest_flag(flag: str, help: str, **argparse_kwargs: Any) -> dict[str, Any]:
    """A field's flag on the pytest front only (no CLI flag), declared as :func:`_flag`
    declares the CLI's: :func:`add_pytest_options` and :func:`pytest_values` serve both."""
    return {"flag": "", "help": help, "argparse": argparse_kwargs, "pytest": (flag, help)}


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """A run's settings (defaults are the command line's)."""

    out: str = field(default="out", metadata=_flag(
        "--out", "output folder, claimed by one run at a time (default: %(default)s)",
        metavar="DIR"))
    batch_size: int | None = field(default=PLAN_DEFAULTS.batch_size, metadata=_flag(
        "--batch-size", "cells per world (default: one world per platform)",
        metavar="N", type=int))
    jobs: int = field(default=1, metadata=_flag(
        "--jobs", "worlds (jobs) run at once", metavar="N", type=int))
    runner: RunnerChoice = field(default=RUNNER, metadata=_flag(
        "--runner", "how worlds are isolated: local, sandbox, docker, or auto "
        "(docker > sandbox > local; default: %(default)s)",
        pytest=("--cpmatrix-runner", "how worlds are isolated: local, sandbox, docker "
                f"(default: {RUNNER})")))
    launcher: Launcher = field(default=LAUNCHER, metadata=_flag(
        "--launcher", "how a local world's ranks start: fork (one parent imports torch "
        "once, then forks the ranks) or torchrun (default: %(default)s)",
        choices=LAUNCHERS,
        pytest=("--cpmatrix-launcher", f"how ranks start (default: {LAUNCHER})")))
    pack: Packing = field(default="slots", metadata=_flag(
        "--pack", "how a world runs its cells: slots (cells on disjoint ranks at once, "
        "each in a process group of its own ranks, packed widest and longest first) or "
        "serial (one cell at a time) (default: %(default)s)", choices=PACKINGS))
    world_ranks: int | None = field(default=None, metadata=_flag(
        "--world-ranks", "ranks each world launches, for cells to run side by side on "
        "(default: the widest cell's on cpu; on cuda every GPU of the host, or of a "
        "Slurm node, in one world)", metavar="N", type=int,
        pytest=("--cpmatrix-world-ranks", "ranks per world, for tests to run side by side "
                "on (default: the widest test's)")))
    mutants: bool = field(default=False, metadata=_flag(
        "--mutants", "also run each cell once per declared mutant; a surviving mutant fails",
        action="store_true"))
    dry_run: bool = field(default=False, metadata=_flag(
        "--dry-run", "print the plan; run nothing", action="store_true"))
    gpus: int | None = field(default=None, metadata=_flag(
        "--gpus", "cuda devices in the pool (default: all visible); cuda cells with more "
        "ranks are skipped", metavar="N", type=int))
    keep_order: bool = field(default=PLAN_DEFAULTS.keep_order, metadata=_flag(
        "--keep-order",
        "run cells one at a time in matrix order (within each size) instead of "
        "longest-first", action="store_true"))
    order: str | None = field(default=None, metadata=_flag(
        "--order", "the order each world runs its cells in: matrix, reverse, or random "
        "(random:SEED to repeat one; the seed is printed and recorded); to find cells whose "
        "verdict depends on another cell (default: widest, then longest first)",
        metavar="matrix|reverse|random[:SEED]"))
    python: str = field(default=sys.executable, metadata=_flag(
        "--python", "interpreter that launches the worlds (default: this one)",
        metavar="PATH"))
    no_cache: bool = field(default=_CACHE.no_cache, metadata=_flag(
        "--no-cache", "run every cell; do not reuse or store cached passes",
        action="store_true"))
    cache_dir: str | None = field(default=_CACHE.cache_dir, metadata=_flag(
        "--cache-dir", "result cache folder (default: $XDG_CACHE_HOME/cpmatrix)",
        metavar="DIR"))
    remote_cache: str | None = field(default=_CACHE.remote_cache, metadata=_flag(
        "--remote-cache", "a Bazel HTTP remote cache behind the local one (bazel-remote, "
        "nginx WebDAV): http(s)://host[:port][/prefix]; overrides the matrix's "
        "remote_cache:, \"\" turns it off; credentials from $CPMATRIX_REMOTE_CACHE_TOKEN "
        "or netrc, never the URL (docs/cache.md)", metavar="URL"))
    remote_cache_read_only: bool = field(default=_CACHE.remote_cache_read_only, metadata=_flag(
        "--remote-cache-read-only", "read the remote cache, never write it (pull-request "
        "builds)", action="store_true"))
    plain: bool = field(default=False, metadata=_flag(
        "--plain", "plain progress lines even on a terminal", action="store_true"))
    abort_grace_s: float = field(default=_TIMINGS.abort_grace_s, metadata=_flag(
        "--abort-grace", "seconds the other ranks get to finish a cell after one rank "
        "failed it (then the world is torn down)", metavar="S", type=float,
        pytest=("--cpmatrix-abort-grace", "seconds the other ranks get to finish a test "
                "after one rank failed it (then the world is torn down; default: "
                f"{_TIMINGS.abort_grace_s:g})")))
    startup_timeout_s: float = field(default=_TIMINGS.startup_timeout_s, metadata=_flag(
        "--startup-timeout", "seconds a world may take to start its first cell",
        metavar="S", type=float))
    teardown_grace_s: float = field(default=_TIMINGS.teardown_grace_s, metadata=_flag(
        "--teardown-grace", "seconds a world's ranks may take to exit after its last cell",
        metavar="S", type=float))
    dead_rank_grace_s: float = field(default=_TIMINGS.dead_rank_grace_s, metadata=_flag(
        "--dead-rank-grace", "seconds torchrun gets to tear a world down after a rank died "
        "(then cpmatrix does)", metavar="S", type=float))
    dump_wait_s: float = field(default=_TIMINGS.dump_wait_s, metadata=_flag(
        "--dump-wait", "seconds between asking a hung world for its stacks and killing it",
        metavar="S", type=float))
    profile: bool = field(default=False, metadata=_flag(
        "--profile", "each rank prints a PROFILE line per cell into its log: the times of "
        "the cell's environment, isolation checks, barrier, group check and setup",
        action="store_true"))

    runs_per_test: int = field(default=PLAN_DEFAULTS.runs, metadata=_flag(
        "--runs-per-test", "run each selected cell N times (run numbers 1..N, each its own "
        "seed; run 1 keeps a plain run's): a cell whose runs disagree is FLAKY, one that "
        "fails them all fails; the result cache is off (default: %(default)s)",
        metavar="N", type=int))

    maxfail: int = field(default=0, metadata=_flag(
        "--maxfail", "stop after N cells did not pass (-x: after the first); the cells not "
        "run are reported interrupted, saying why, and no gate passes the run (default: "
        "run them all)", metavar="N",
        type=int))
    failed_first: bool = field(default=False, metadata=_flag(
        "--failed-first", "run first the cells that did not pass when they last ran in "
        "--out (what repro --failed reruns), then the rest in matrix order, as pytest's "
        "--ff", action="store_true"))

    shard: str | None = field(default=None, metadata=_flag(
        "--shard", "run only the K-th of N time-balanced shards of the selection (CI job "
        "matrices; merge the shards' --out folders with `cpmatrix merge`)", metavar="K/N"))
    durations_from: str | None = field(default=None, metadata=_flag(
        "--durations-from", "recorded durations to balance shards and Slurm jobs by: an "
        "earlier run's durations.json, e.g. the last release's (default: the one in --out)",
        metavar="FILE"))
    scheduler: SchedulerName = field(default="host", metadata=_flag(
        "--scheduler", "where worlds run: host (this machine) or slurm (each world a "
        "Slurm job started with srun; --out must be on a filesystem the nodes share) "
        "(default: %(default)s)", choices=choices(SchedulerName)))
    partition: str | None = field(default=None, metadata=_flag(
        "--partition", "Slurm partition of the jobs (default: the cluster's)", metavar="P"))
    account: str | None = field(default=None, metadata=_flag(
        "--account", "Slurm account charged for the jobs", metavar="A"))
    max_jobs: int = field(default=_SLURM.max_jobs, metadata=_flag(
        "--max-jobs", "Slurm jobs in flight at once (default: %(default)s)", metavar="N",
        type=int))
    slurm_args: tuple[str, ...] = field(default=(), metadata=_flag(
        "--slurm-arg", "one more argument for srun, e.g. --slurm-arg=--time=30 "
        "(repeatable)", metavar="ARG", action="append", dest_default=()))
    pending_timeout_s: float = field(default=_SLURM.pending_timeout_s, metadata=_flag(
        "--pending-timeout", "seconds a Slurm job may wait PENDING before its cells fail "
        "(default: %(default)s)", metavar="S", type=float))

    def __post_init__(self) -> None:
        if self.batch_size is not None and self.batch_size < 1:
            raise UsageError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.jobs < 1:
            raise UsageError(f"--jobs must be >= 1, got {self.jobs}")
        if self.maxfail < 0:
            raise UsageError(f"--maxfail must be >= 0, got {self.maxfail}")
        if self.runs_per_test < 1:
            raise UsageError(f"--runs-per-test must be >= 1, got {self.runs_per_test}")
        if self.runs_per_test > 1 and self.mutants:
            raise UsageError("--runs-per-test N (N > 1) cannot be combined with --mutants: a "
                             "mutant is judged against one run of its cell (measure the "
                             "cells' flakiness first, then score mutants)")
        if self.max_jobs < 1:
            raise UsageError(f"--max-jobs must be >= 1, got {self.max_jobs}")
        if self.shard is not None:
            parse_shard(self.shard)
        if self.scheduler not in choices(SchedulerName):
            raise UsageError(f"--scheduler must be one of {', '.join(choices(SchedulerName))}, "
                             f"got {self.scheduler!r}")
        if self.launcher not in LAUNCHERS:
            raise UsageError(f"--launcher must be one of {', '.join(LAUNCHERS)}, "
                             f"got {self.launcher!r}")
        if self.pack not in PACKINGS:
            raise UsageError(f"--pack must be one of {', '.join(PACKINGS)}, got {self.pack!r}")
        if self.world_ranks is not None and self.world_ranks < 1:
            raise UsageError(f"--world-ranks must be >= 1, got {self.world_ranks}")
        if self.gpus is not None and self.gpus < 0:
            raise UsageError(f"--gpus must be >= 0, got {self.gpus}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_s") and not value >= 0:
                raise UsageError(f"{f.metadata['flag']} must be >= 0 seconds, got {value}")
        if self.order is not None:
            parse_order(self.order)
        if self.remote_cache:  # checked at parse time: a bad URL is exit 2 before any run
            # Imported here: the pytest plugin reads these declarations in every pytest
            # run, and the HTTP client is most of their import time.
            from cpmatrix.cache.http import RemoteSettings

            RemoteSettings.parse(self.remote_cache)
        # Once, here: the worlds run in folders of their own (frozen: set in place).
        for name in ("out", "cache_dir", "durations_from"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, os.path.abspath(os.path.expanduser(value)))
        object.__setattr__(self, "python", resolve_interpreter(self.python))

    @property
    def timings(self) -> FaultTimings:
        """``--abort-grace``, ``--startup-timeout``, ... as the jobs read them."""
        return FaultTimings(
            abort_grace_s=self.abort_grace_s, startup_timeout_s=self.startup_timeout_s,
            teardown_grace_s=self.teardown_grace_s, dead_rank_grace_s=self.dead_rank_grace_s,
            dump_wait_s=self.dump_wait_s)

    @property
    def slurm(self) -> SlurmSettings:
        """``--partition``, ``--account``, ``--slurm-arg``, ``--pending-timeout``,
        ``--max-jobs``."""
        return SlurmSettings(partition=self.partition, account=self.account,
                             extra_args=tuple(self.slurm_args),
                             pending_timeout_s=self.pending_timeout_s, max_jobs=self.max_jobs)

    @property
    def planning(self) -> PlanSettings:
        """``--batch-size``, ``--keep-order``, ``--runs-per-test``."""
        return PlanSettings(batch_size=self.batch_size, keep_order=self.keep_order,
                            runs=self.runs_per_test)

    @property
    def caching(self) -> CacheSettings:
        """``--no-cache``, ``--cache-dir``, ``--remote-cache``, ``--remote-cache-read-only``."""
        return CacheSettings(no_cache=self.no_cache, cache_dir=self.cache_dir,
                             remote_cache=self.remote_cache,
                             remote_cache_read_only=self.remote_cache_read_only)

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> RunOptions:
        """The options parsed by :func:`add_run_arguments` (absent ones keep defaults)."""
        given = vars(ns)
        values = {f.name: given[f.name] for f in dataclasses.fields(cls) if f.name in given}
        if values.get("slurm_args") is not None:  # argparse's append gives a list
            values["slurm_args"] = tuple(values["slurm_args"])
        else:
            values.pop("slurm_args", None)
        return cls(**values)

    @classmethod
    def from_pytest(cls, getoption: Callable[[str], Any], **given: Any) -> RunOptions:
        """The options :func:`add_pytest_options` declared, read with pytest's
        ``config.getoption``; ``given``: the fields the pytest front sets itself."""
        return cls(**pytest_values(cls, getoption), **given)


def resolve_interpreter(python: str) -> str:
    """``--python`` as an absolute path (not following links: a venv's ``bin/python`` is a
    link, and the venv is what it means); :class:`UsageError` naming it when it is no
    executable file.

    >>> resolve_interpreter(sys.executable) == os.path.abspath(sys.executable)
    True
    >>> resolve_interpreter("./no/such/python")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    cpmatrix.errors.UsageError: --python ./no/such/python: no such interpreter (no file ...)
    """
    if os.sep in python or (os.altsep and os.altsep in python):
        path = os.path.abspath(os.path.expanduser(python))
    else:
        found = shutil.which(python)
        if found is None:
            raise UsageError(f"--python {python}: no such interpreter (not found on PATH)")
        path = os.path.abspath(found)
    if not os.path.isfile(path):
        raise UsageError(f"--python {python}: no such interpreter (no file {path})")
    if not os.access(path, os.X_OK):
        raise UsageError(f"--python {python}: {path} is not executable")
    return path


def add_run_arguments(parser: argparse.ArgumentParser, *,
                      exclude: Collection[str] = ()) -> None:
    """One flag per :class:`RunOptions` field (``exclude``: field names to leave out)."""
    for f in dataclasses.fields(RunOptions):
        if f.name in exclude:
            continue
        meta = f.metadata
        kwargs = dict(meta["argparse"])
        # An append flag starts from None: a tuple default would be appended to in place.
        default = None if kwargs.pop("dest_default", None) is not None else f.default
        parser.add_argument(meta["flag"], dest=f.name, default=default, help=meta["help"],
                            **kwargs)


def add_pytest_options(group: Any, declared: Any = RunOptions, *,
                       only: Collection[str] | None = None) -> None:
    """The pytest front's flags of ``declared``'s fields that have one
    (``--cpmatrix-runner``, ...; ``only``: those fields, in declaration order), on a
    pytest option group: the CLI flag's type, choices, metavar and default, under the
    front's name and help (:func:`pytest_values` reads them back)."""
    for f in dataclasses.fields(declared):
        if f.metadata.get("pytest") is not None and (only is None or f.name in only):
            flag, help = f.metadata["pytest"]
            group.addoption(flag, default=f.default, help=help, **f.metadata["argparse"])


def pytest_values(declared: Any, getoption: Callable[[str], Any]) -> dict[str, Any]:
    """Field name -> its value, for ``declared``'s fields with a pytest flag, read with
    pytest's ``config.getoption``."""
    return {f.name: getoption(_pytest_dest(f.metadata["pytest"][0]))
            for f in dataclasses.fields(declared) if f.metadata.get("pytest") is not None}


def _pytest_dest(flag: str) -> str:
    """Where pytest keeps a flag's value (``--cpmatrix-runner`` -> ``cpmatrix_runner``)."""
    return flag.lstrip("-").replace("-", "_")
