"""``cpmatrix run`` and ``cpmatrix spill``: select, run, report; exit 0/1/2/3/4/128+N.

Example::

    $ cpmatrix run --matrix matrix/parity.yaml --platform cpu -k ring --out out
    $ cpmatrix spill --matrix matrix/parity.yaml -k arch=sm_90a
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from cpmatrix.cli.common import add_selection, nothing_selected, select_from_args
from cpmatrix.cli.console import Progress, format_summary
from cpmatrix.errors import ExitCode, UsageError
from cpmatrix.layout import RunLayout
from cpmatrix.matrix.schema import Cell, Platform
from cpmatrix.run.cache import ActionKeys
from cpmatrix.run.cache_layers import remote_settings
from cpmatrix.run.executors import EXECUTORS, executor_for
from cpmatrix.run.options import RunOptions, add_run_arguments
from cpmatrix.run.ordering import Order, arrange, parse_order
from cpmatrix.run.outdir import claim_out
from cpmatrix.run.plan import slot_plan
from cpmatrix.run.provenance import cell_digests, run_source
from cpmatrix.run.session import run_cells
from cpmatrix.run.setup import devices_for, pack_spec, prepare_run
from cpmatrix.run.sharding import (
    recorded_durations,
    recorded_history,
    take_shard,
    write_empty_report,
)
from cpmatrix.run.slurm import slurm_missing, slurm_plan, slurm_scheduling, slurm_worlds
from cpmatrix.run.stopping import exit_code_for, stop_on_signals

__all__ = ["add_parsers", "run"]


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="run the selected cells in batched torchrun worlds")
    add_selection(p)
    p.set_defaults(platform="cpu", only_kind=None, handler=run)
    add_run_arguments(p)
    s = sub.add_parser("spill", help="run only the Triton register-spill gates (kind: spill)")
    add_selection(s)
    s.set_defaults(platform=None, only_kind="spill", handler=run)
    add_run_arguments(s, exclude=("mutants",))


def run(args: argparse.Namespace) -> int:
    options = RunOptions.from_namespace(args)
    if options.scheduler == "slurm" and not options.dry_run:
        missing = slurm_missing()
        if missing is not None:
            raise UsageError(missing)
    out = Path(options.out).resolve()
    # Claim --out first: whatever happens next (a spec error included), the folder can no
    # longer hold the previous run's report for a gate to read as this run's.
    claim = None if options.dry_run else claim_out(out)
    try:
        matrix, expansion, cells = select_from_args(args)
        if args.only_kind:
            cells = [c for c in cells if c.kind == args.only_kind]
        if not cells:
            print(nothing_selected(args, len(expansion.cells)), file=sys.stderr)
            return ExitCode.NOTHING_SELECTED
        selection = cells
        keys = ActionKeys(search_path=matrix.pythonpath)
        if options.shard is not None:
            cells, manifest = take_shard(cells, options.shard, recorded_durations(options, out))
            print(f"shard {manifest.shard}/{manifest.of}: {len(manifest.cells)} of "
                  f"{len(manifest.all_cells)} cells", flush=True)
            if claim is not None:
                manifest.write(out)
                if not cells:  # more shards than cells: an empty report, not a failure
                    write_empty_report(out, claim.run_id, source={
                        **run_source(matrix.path, keys).to_dict(),
                        "cells": cell_digests(selection, keys)})
                    return ExitCode.OK
            elif not cells:
                return ExitCode.OK
        order = parse_order(options.order) if options.order is not None else None
        if order is not None:
            cells = arrange(cells, order)
            print(f"order: {order} (--order {order} runs this order again)", flush=True)
        remote_settings(options, matrix)  # a bad remote_cache: is exit 2, --dry-run too
        if claim is None:
            return _dry_run(cells, {p.name: p for p in matrix.platforms}, options, out, order)
        prepared = prepare_run(options, matrix, cells, claim, keys=keys,
                               selection=selection, order=str(order or ""))
        # A cuda world packs every GPU of its host (under Slurm: of its node, --gpus).
        pack = pack_spec(options, prepared.platforms.values(), devices=prepared.devices)
        if prepared.skipped:
            print(f"skipping {len(prepared.skipped)} cuda cells wider than the "
                  f"{prepared.devices} GPU(s) visible (one rank per GPU); they are reported "
                  "as skipped", file=sys.stderr)
        print(f"runner: {prepared.runner.name} ({prepared.why_runner})", flush=True)
        context = replace(prepared.context, pack=pack)
        jobs, devices, wrap_job = options.jobs, prepared.devices, None
        worlds = jobs
        if options.scheduler == "slurm":
            context, wrap_job = slurm_scheduling(options, context)
            # Slurm places each job on a node with its own GPUs: the pool here only caps
            # how many cuda worlds are in flight (--max-jobs of them at most).
            jobs, devices = options.max_jobs, prepared.devices * options.max_jobs
            worlds = slurm_worlds(prepared.cells, recorded_durations(options, out), jobs)
            print(f"scheduler: slurm (each world one srun job, at most {jobs} at once; "
                  f"--out {out} must be shared with the nodes)", flush=True)
        if options.runs_per_test > 1:
            print(f"runs per test: {options.runs_per_test} (each of the {len(prepared.cells)} "
                  "cells runs that often; runs that disagree make it FLAKY)", flush=True)
        progress = Progress(force_plain=options.plain)
        with stop_on_signals() as stopper:
            try:
                report = run_cells(
                    prepared.cells, prepared.platforms, context,
                    batch_size=options.batch_size, jobs=jobs, worlds=worlds, wrap_job=wrap_job,
                    recorded=recorded_history(options) if options.durations else None,
                    runs=options.runs_per_test,
                    devices=devices, mutants=prepared.mutants,
                    keep_order=options.keep_order, cached=prepared.cached,
                    store=prepared.store, on_start=progress.start,
                    on_result=progress.update, stopper=stopper, skipped=prepared.skipped)
            finally:
                progress.stop()
            write_report_html(out)
            if prepared.cache_note:
                print(prepared.cache_note)
            if prepared.cache_layers is not None:
                for line in prepared.cache_layers.finish():
                    print(line)
                prepared.cache_layers.record(out)
            print(format_summary(report, os.path.relpath(out)))
            if prepared.mutants is not None:
                print(report.mutant_line())
    finally:
        if claim is not None:
            claim.release()
    stopped = report.stopped_by or stopper.signum
    if stopped is not None:
        print(f"stopped by {signal.Signals(stopped).name}: unfinished cells are reported as "
              "interrupted", file=sys.stderr)
        return exit_code_for(stopped)
    if not prepared.cells:
        print(_nothing_fits(len(prepared.skipped), prepared.devices)
              + "; the report lists them as skipped", file=sys.stderr)
        return ExitCode.NOTHING_SELECTED
    # A skipped cell is not ok either: 0 means every selected cell passed.
    return ExitCode.OK if all(r.status.ok for r in report.results.values()) else ExitCode.FAILURES


def write_report_html(out: Path) -> None:
    """report.html beside report.xml; a rendering problem never fails the run."""
    from cpmatrix.report import ReportError
    from cpmatrix.report.html import write_html

    try:
        write_html(RunLayout(out).report_xml, RunLayout(out).report_html)
    except (ReportError, OSError) as exc:
        print(f"warning: report.html not written: {exc}", file=sys.stderr)


def _nothing_fits(skipped: int, gpus: int) -> str:
    return (f"nothing to run: each of the {skipped} selected cells needs more GPUs than the "
            f"{gpus} visible (one rank per GPU; select narrower meshes, e.g. -k 1x1)")


def _dry_run(cells: list[Cell], platforms: Mapping[str, Platform], options: RunOptions,
             out: Path, order: Order | None) -> int:
    """Print the plan each executor makes (the busiest first); run nothing."""
    devices, fits, skipped, needs = devices_for(cells, platforms, options)
    # With --order the worlds are planned without recorded durations (as a real run).
    durations = recorded_durations(options, out) if order is None else {}
    slots = (slurm_worlds(fits, durations, options.max_jobs) if options.scheduler == "slurm"
             else options.jobs)
    pack = pack_spec(options, platforms.values(), devices=devices)
    runs = options.runs_per_test  # each run is an entry of the plan, as in a real run
    plans = [(ex, ex.plan([c for c in fits if executor_for(c.kind) is ex for _ in range(runs)],
                          durations=durations, batch_size=options.batch_size,
                          keep_order=options.keep_order, mutants=None, worlds=slots,
                          pack=pack))
             for ex in reversed(EXECUTORS)]
    jobs = ", ".join(f"{len(batches)} {ex.plural}" for ex, batches in plans if batches)
    times = f" x {runs} runs" if runs > 1 else ""
    print(f"plan: {len(fits)} cells{times} in {jobs or 'no jobs'} (runner: {options.runner})")
    for ex, batches in plans:
        for b in batches:
            print(ex.describe(b))
            for line in ex.describe_cells(b):
                print(line)
    if options.scheduler == "slurm":
        print(slurm_plan(plans, options.max_jobs))
    else:
        print(slot_plan([b for _, bs in plans for b in bs], options.jobs,
                        where="host", unit="jobs", flag="--jobs"))
    if skipped:
        print(f"skipped (not run on this host, reported as skipped): {len(skipped)} cells")
        for c, why in skipped:
            print(f"  {c.id}  {why}")
    if needs and devices == 0:
        print("note: no CUDA device is visible here, so a real run exits 2; "
              "--gpus N plans for a host with N GPUs")
    if not fits:
        print(_nothing_fits(len(skipped), devices), file=sys.stderr)
        return ExitCode.NOTHING_SELECTED
    return ExitCode.OK
