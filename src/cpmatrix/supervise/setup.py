"""A run's setup, shared by ``cpmatrix run``/``spill``, ``repro`` and the nox sessions.

From the options and the selected cells to what :func:`~cpmatrix.supervise.session.run_cells`
needs beyond its plan: the cells that fit this host's devices (the rest skipped, with
why: :func:`devices_for`) and how its worlds pack them (:func:`pack_spec`), both for the
plan's :class:`~cpmatrix.plan.plan.Placement`; then, for the placed cells, the runner
(and why it was chosen), the cells' sources, the interpreter's identity, the declared
mutants, and the result cache's hits and store (:func:`prepare_run`). The run's
:class:`~cpmatrix.supervise.context.RunContext` is made once, from these, by
:func:`make_context` (in :func:`cpmatrix.supervise.assembly.assemble`).

Example::

    prepared = prepare_run(options, matrix, cells, placement, claim,
                           scheduler=scheduler_for(options), executors=EXECUTORS)
    context = make_context(matrix, prepared.out, prepared.runner, options, claim.run_id,
                           sources=prepared.sources)
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cpmatrix.cache.http import RemoteCache, RemoteSettings
from cpmatrix.cache.key import ActionKeys, ReadHashes, ResultCache, default_cache_dir
from cpmatrix.cache.layers import CacheLayers, remote_settings
from cpmatrix.cache.machine import LocalMachine, MachineIdentity, MachineSource, machine_identity
from cpmatrix.cache.portable import Anchors, project_root
from cpmatrix.cache.provenance import cell_digests, run_source, stamp
from cpmatrix.cache.toolchain import probe_interpreter
from cpmatrix.errors import UsageError
from cpmatrix.fsutil import atomic_write_json
from cpmatrix.layout import RunLayout
from cpmatrix.matrix.schema import Cell, Matrix, Platform
from cpmatrix.paths import IMPORT_ROOT
from cpmatrix.plan.batches import fit_to_devices
from cpmatrix.plan.devices import visible_cuda_devices
from cpmatrix.plan.packing import PackSpec
from cpmatrix.plan.plan import Placement
from cpmatrix.result import Result
from cpmatrix.supervise.context import RunContext
from cpmatrix.supervise.declared_mutants import discover_mutants
from cpmatrix.supervise.entry import Entry
from cpmatrix.supervise.executors.base import Executor, executor_for
from cpmatrix.supervise.executors.spare import Spare
from cpmatrix.supervise.options import RunOptions
from cpmatrix.supervise.outdir import OutClaim
from cpmatrix.supervise.runners import ENV_ALLOW, Runner, resolve_runner
from cpmatrix.supervise.schedulers import Scheduler

__all__ = ["PreparedRun", "children_pythonpath", "devices_for", "make_context", "pack_spec",
           "prepare_run"]

#: Stores a fresh pass; returns why it was not stored ("" when it was, or was not
#: meant to be: a failure, a retried pass).
Store = Callable[[Cell, Result], str]


@dataclass
class PreparedRun:
    """Everything a run needs beyond its cells' selection and their placement."""

    platforms: dict[str, Platform]
    runner: Runner
    why_runner: str
    #: The output folder (``--out``, absolute).
    out: Path
    #: Per cell id, the source identity its results carry (``RunContext.sources``).
    sources: dict[str, dict[str, str]]
    toolchain: dict[str, str]
    mutants: dict[str, list[str]] | None
    cached: dict[str, Result]
    store: Store | None
    #: One line on the cache lookup (hits, time, files hashed); "" with --no-cache.
    cache_note: str = ""
    #: The local and remote caches, to finish (uploads) after the run; None: --no-cache.
    cache_layers: CacheLayers | None = None
    #: The machine the cells run on (in their keys and their results' source).
    machine: MachineIdentity | None = None


def devices_for(cells: Sequence[Cell], platforms: Mapping[str, Platform],
                options: RunOptions, *, executors: Sequence[Executor],
                ) -> tuple[int, list[Cell], list[tuple[Cell, str]], bool]:
    """(devices in the pool, cells that fit, cells skipped with why, any cell needs one),
    each cell's need asked of its kind's executor among ``executors``."""

    def need(cell: Cell) -> int:
        return executor_for(executors, cell.kind).devices_needed([Entry(cell=cell)],
                                                                 platforms[cell.platform])

    needs = any(need(c) for c in cells)
    devices = options.gpus if options.gpus is not None else (
        visible_cuda_devices() if needs else 0)
    if needs and devices > 0:
        fits, skipped = fit_to_devices(cells, need=need, devices=devices)
        return devices, fits, skipped, needs
    return devices, list(cells), [], needs


def pack_spec(options: RunOptions, platforms: Iterable[Platform], *, devices: int,
              scheduler: Scheduler) -> PackSpec:
    """How the run's worlds place cells on their ranks (``--pack``, ``--world-ranks``).

    A cuda platform's cells stay in one world over every GPU of the host (``devices``;
    under Slurm, one node's), whatever ``--jobs`` says: packing runs its narrow cells side
    by side on the devices, where several worlds would each hold their widest cell's GPUs.
    Under Slurm (``scheduler.whole_platform`` false) its worlds are split over nodes as
    any platform's. ``--world-ranks`` asks for more (cpu) or fewer ranks.

    >>> from cpmatrix.matrix.schema import Platform
    >>> cpu = Platform(name="cpu", backend="gloo", device="cpu")
    >>> gpu = Platform(name="cuda", backend="nccl", device="cuda")
    >>> from cpmatrix.supervise.schedulers import scheduler_for
    >>> host = RunOptions()
    >>> pack_spec(host, [cpu, gpu], devices=8, scheduler=scheduler_for(host))
    PackSpec(serial=False, ranks=(('cuda', 8),), whole=('cuda',), ordered=False)
    >>> slurm = RunOptions(pack="serial", world_ranks=16, scheduler="slurm")
    >>> pack_spec(slurm, [cpu, gpu], devices=4, scheduler=scheduler_for(slurm))
    PackSpec(serial=True, ranks=(('cpu', 16), ('cuda', 4)), whole=(), ordered=False)
    """
    ranks: list[tuple[str, int]] = []
    whole: list[str] = []
    keep_whole = scheduler.whole_platform
    for p in platforms:
        if options.world_ranks is not None and options.world_ranks > p.max_ranks:
            raise UsageError(
                f"--world-ranks {options.world_ranks}: more than platform {p.name!r} may "
                f"launch (max_ranks {p.max_ranks}; raise platforms.{p.name}.max_ranks in "
                "the matrix to allow it)")
        if p.device == "cuda":
            want = devices if options.world_ranks is None else min(options.world_ranks, devices)
            ranks.append((p.name, max(1, want)))
            if keep_whole:
                whole.append(p.name)
        elif options.world_ranks is not None:
            ranks.append((p.name, options.world_ranks))
    # --keep-order: matrix order, one cell at a time (to bisect state leaking between cells).
    serial = options.pack == "serial" or options.keep_order
    # --order: the cells come in that order, which is their priority (plan/ordering.py).
    return PackSpec(serial=serial, ranks=tuple(ranks), whole=tuple(whole),
                    ordered=options.order is not None or options.failed_first)


def make_context(matrix: Matrix, out: Path, runner: Runner, options: RunOptions,
                 run_id: str = "", *, sources: Mapping[str, Mapping[str, str]] | None = None,
                 order: str = "", pack: PackSpec | None = None,
                 durations: Mapping[str, float] | None = None,
                 repro: tuple[str, ...] | None = None, spare: Spare | None = None) -> RunContext:
    """The executors' shared context for a run of ``matrix`` into ``out``: made once per
    run, whole (the cells' ``sources``, ``--order`` as resolved, the worlds' ``pack`` and
    the ``durations`` they pack by, the ``repro`` line's flags, a ``spare`` launcher)."""
    return RunContext(
        out_root=out, runner=runner, run_id=run_id, python=options.python,
        launcher=options.launcher,
        pythonpath=children_pythonpath(matrix.pythonpath),
        project_roots=matrix.pythonpath,
        readonly=(str(Path(matrix.path).resolve().parent),),
        timings=options.timings, profile=options.profile,
        compile_cache=None if _uncached(options) else cache_root(options) / "spill",
        sources=sources or {}, order=order, pack=pack or PackSpec(),
        durations=durations or {}, repro=repro, spare=spare,
    )


def children_pythonpath(pythonpath: Sequence[str]) -> tuple[str, ...]:
    """The children's ``PYTHONPATH``: the matrix's pythonpath, then cpmatrix's import root.

    >>> children_pythonpath(["/p"])[0], len(children_pythonpath(["/p"]))
    ('/p', 2)
    """
    return (*pythonpath, str(IMPORT_ROOT))


def _uncached(options: RunOptions) -> bool:
    """Whether the run neither reuses nor stores results: ``--no-cache``, or
    ``--runs-per-test N`` with N > 1 (a measurement: every run must really run)."""
    return options.no_cache or options.runs_per_test > 1


def cache_root(options: RunOptions) -> Path:
    return Path(options.cache_dir).resolve() if options.cache_dir else default_cache_dir()


def prepare_run(options: RunOptions, matrix: Matrix, cells: Sequence[Cell],
                placement: Placement, claim: OutClaim, *, keys: ActionKeys | None = None,
                selection: Sequence[Cell] | None = None, order: str = "",
                scheduler: Scheduler, executors: Sequence[Executor],
                machine: MachineSource | None = None) -> PreparedRun:
    """Runner, context, toolchain, mutants and cache for a run of ``cells``, of which
    ``placement`` runs its cells here (the cache and the mutants are of those).

    ``keys``: the run's source digests (made here if not given); ``selection``: the whole
    selection when ``cells`` is one shard of it (``run.json`` records the digests of
    all of it); ``order``: ``--order`` as resolved (recorded); ``executors``: the
    registry, one executor per kind of cell (handed down by the front); ``machine``: what
    describes the machine (default: this one, :class:`~cpmatrix.cache.machine.LocalMachine`).

    Raises :class:`UsageError` (exit 2) for what cannot run here: cuda cells with no
    device, an unusable runner, an interpreter that cannot run, a case whose mutants
    cannot be read.
    """
    out = Path(options.out).resolve()
    platforms = {p.name: p for p in matrix.platforms}
    fits = placement.cells
    scheduler.check_devices(needs=placement.needs_devices, devices=placement.devices)
    runner, why = resolve_runner(options.runner, platforms[cells[0].platform],
                                 Path(matrix.path).resolve().parent)
    probe = probe_interpreter(options.python)
    # Paths in the key and the entries are written against these (location independence).
    anchors = probe.anchors(project_root(matrix.path))
    toolchain = probe.identity(anchors)
    keys = keys if keys is not None else ActionKeys(search_path=matrix.pythonpath)
    source = run_source(matrix.path, keys, made=matrix)
    mine = cell_digests(cells, keys)
    ident = machine_identity(
        # The capability memo is a fact of this machine, not a result: one folder for
        # every --cache-dir (its name holds the toolchain and the CPU flags).
        machine if machine is not None else LocalMachine(
            options.python, memo=default_cache_dir() / "machine", toolchain=toolchain),
        {platforms[c.platform].device for c in fits})
    platform_of = {c.id: c.platform for c in cells}
    sources = {cid: {**s, "machine": ident.summary(platforms[platform_of[cid]].device)}
               for cid, s in stamp(mine, source).items()}
    mutants = discover_mutants(matrix.pythonpath, fits, options.python,
                               executors=executors) if options.mutants else None
    cached, store, note, layers = _cache_hooks(options, fits, out, runner, platforms,
                                               mutants is not None, toolchain, keys, anchors,
                                               remote_settings(options.caching, matrix), ident,
                                               executors)
    # Everything that can refuse the run is behind us: only now does the last run's
    # evidence make way (into previous/), so a run that cannot start leaves it whole.
    claim.take_over()
    atomic_write_json(RunLayout(out).run_info, {
        "run_id": claim.run_id, "argv": sys.argv, "toolchain": toolchain,
        "machine": {"cpu": ident.cpu, **({"cuda": ident.cuda} if ident.cuda else {})},
        "runner": runner.name, "order": order or "planned",
        # The digest of every selected cell (a shard's: the whole selection's), so a
        # merge can refuse shards of different sources even when they share no cell.
        "source": {**source.to_dict(), "cells": {
            **mine, **(cell_digests(selection, keys) if selection is not None else {})}},
    })
    return PreparedRun(platforms=platforms, runner=runner, why_runner=why, out=out, sources=sources,
                       toolchain=toolchain,
                       mutants=mutants, cached=cached, store=store, cache_note=note,
                       cache_layers=layers, machine=ident)


def _cache_hooks(options: RunOptions, cells: Sequence[Cell], out: Path, runner: Runner,
                 platforms: Mapping[str, Platform], mutants: bool,
                 toolchain: Mapping[str, str], keys: ActionKeys, anchors: Anchors,
                 remote: RemoteSettings | None, machine: MachineIdentity,
                 executors: Sequence[Executor],
                 ) -> tuple[dict[str, Result], Store | None, str, CacheLayers | None]:
    """Cached passes for ``cells``, a function that stores new passes, a line on the
    lookup, and the cache's layers (local, remote) to finish after the run."""
    if _uncached(options):
        return {}, None, ("" if options.no_cache else f"cache: off (--runs-per-test "
                          f"{options.runs_per_test}: every run runs, none is stored)"), None
    t0 = time.monotonic()
    hashes = ReadHashes()
    cache = ResultCache(cache_root(options), hashes, anchors)
    identity = runner.identity()
    allow = {k: anchors.text(os.environ[k]) for k in ENV_ALLOW if k in os.environ}
    digests = {
        c.id: keys.digest(c, runner_identity={
                              **identity, **executor_for(executors, c.kind).cache_identity()},
                          env={**allow, **dict(platforms[c.platform].env)},
                          toolchain=toolchain,
                          machine=machine.for_device(platforms[c.platform].device))
        for c in cells
    }
    layers = CacheLayers(cache, None if remote is None else RemoteCache(remote), digests,
                         out=out)
    hits = {} if mutants else layers.lookup(cells)
    where = (f" ({layers.local_hits} local, {layers.remote_hits} remote)"
             if remote is not None else "")
    note = (f"cache: {len(hits)} of {len(cells)} cells cached{where} (looked up in "
            f"{time.monotonic() - t0:.2f} s, {hashes.hashed} files hashed)")
    private = runner.private_files

    def store(cell: Cell, result: Result) -> str:
        if result.reads is None:
            why = "what it read was not observed on every rank"
        else:
            settled = hashes.settle(result.reads, private_files=private)
            if not isinstance(settled, str):
                layers.store(cell, result, settled)
                return ""
            why = settled
        print(f"note: {cell.id} is not cached: {why}", file=sys.stderr)
        return why

    return hits, store, note, layers
