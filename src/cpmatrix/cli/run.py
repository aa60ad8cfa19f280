"""``cpmatrix run``: select cells, run them in batched worlds, report, exit 0/1/2/3.

Example::

    $ cpmatrix run --matrix matrix/parity.yaml --platform cpu -k ring --out out
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from cpmatrix.cli.console import Progress, format_summary
from cpmatrix.errors import ExitCode, UsageError
from cpmatrix.fsutil import atomic_write_json
from cpmatrix.matrix.schema import Cell, Matrix, Platform
from cpmatrix.paths import IMPORT_ROOT
from cpmatrix.result import Result
from cpmatrix.run.cache import ActionKeys, ResultCache, default_cache_dir
from cpmatrix.run.executors.world import WorldOptions
from cpmatrix.run.outdir import OutClaim, claim_out
from cpmatrix.run.plan import fit_to_devices, plan_batches
from cpmatrix.run.runners import ENV_ALLOW, Runner, resolve_runner, runner_names
from cpmatrix.run.session import load_durations, run_cells
from cpmatrix.run.stopping import exit_code_for, stop_on_signals
from cpmatrix.run.toolchain import interpreter_identity

__all__ = ["add_run_parser", "cmd_run", "discover_mutants", "visible_cuda_devices"]


def add_run_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from cpmatrix.cli import _add_selection

    p = sub.add_parser("run", help="run the selected cells in batched torchrun worlds")
    _add_selection(p)
    p.set_defaults(platform="cpu", only_kind=None)
    _add_run_options(p)
    s = sub.add_parser("spill", help="run only the Triton register-spill gates (kind: spill)")
    _add_selection(s)
    s.set_defaults(platform=None, only_kind="spill", mutants=False)
    _add_run_options(s, spill=True)


def _add_run_options(p: argparse.ArgumentParser, spill: bool = False) -> None:
    p.add_argument("--out", default="out", help="output folder (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=None, metavar="N",
                   help="cells per torchrun world (default: one world per platform x world size)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="worlds run at once")
    p.add_argument("--runner", default="local", choices=(*runner_names(), "auto"),
                   help="how worlds are launched (default: %(default)s)")
    if not spill:
        p.add_argument("--mutants", action="store_true",
                       help="also run each cell once per declared mutant; a surviving mutant "
                       "fails")
    p.add_argument("--abort-grace", type=float, default=5.0, metavar="S",
                   help="seconds to wait for the other ranks after one rank fails a cell")
    p.add_argument("--dry-run", action="store_true", help="print the plan; run nothing")
    p.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="cuda devices in the pool (default: all visible); cuda cells with "
                   "more ranks are skipped")
    p.add_argument("--keep-order", action="store_true",
                   help="run cells in matrix order instead of longest-first")
    p.add_argument("--python", default=sys.executable, metavar="PATH",
                   help="interpreter that launches the worlds (default: this one)")
    p.add_argument("--no-cache", action="store_true",
                   help="run every cell; do not reuse or store cached passes")
    p.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="result cache folder (default: $XDG_CACHE_HOME/cpmatrix)")
    p.add_argument("--plain", action="store_true", help="plain progress lines even on a TTY")


def make_world_options(
    matrix: Matrix, out: Path, runner: Runner, *, abort_grace: float, python: str = sys.executable,
    run_id: str = "",
) -> WorldOptions:
    project_root = str(Path(matrix.path).resolve().parent.parent)
    src_dir = str(IMPORT_ROOT)
    return WorldOptions(
        out_root=out,
        runner=runner,
        pythonpath=(*matrix.pythonpath, src_dir),
        project_roots=matrix.pythonpath,
        project_root=project_root,
        abort_grace_s=abort_grace,
        python=python,
        run_id=run_id,
    )


def visible_cuda_devices() -> int:
    """Count CUDA devices without importing torch (nvidia-smi, else 0)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return 0
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    count = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        count = min(count, len([d for d in visible.split(",") if d.strip()]))
    return count


def discover_mutants(matrix: Matrix, cells: list[Cell], python: str = sys.executable,
                     ) -> dict[str, list[str]]:
    """Import each case once (in a subprocess: torch stays out of this process) and
    read the mutants it declares (``fn.__cpmatrix_mutants__``)."""
    cases = sorted({c.case for c in cells if c.kind != "spill"})
    code = (
        "import importlib, json, sys\n"
        f"sys.path[:0] = {list(matrix.pythonpath)!r}\n"
        "out = {}\n"
        "for ref in json.loads(sys.argv[1]):\n"
        "    mod, _, attr = ref.partition(':')\n"
        "    try:\n"
        "        fn = getattr(importlib.import_module(mod), attr)\n"
        "        out[ref] = list(getattr(fn, '__cpmatrix_mutants__', {}) or {})\n"
        "    except Exception as exc:\n"
        "        out[ref] = {'error': f'{type(exc).__name__}: {exc}'}\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([python, "-c", code, json.dumps(cases)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise UsageError(f"could not read declared mutants:\n{proc.stderr[-2000:]}")
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    per_cell: dict[str, list[str]] = {}
    for c in cells:
        declared = found.get(c.case, []) if c.kind != "spill" else []
        if isinstance(declared, dict):
            # A case that cannot be imported has no mutants to read: say so, never "0/0".
            raise UsageError(f"--mutants: cannot import {c.case}: {declared['error']}")
        names = declared
        # The unmutated run comes first: a mutant is only "killed" against a green cell.
        per_cell[c.id] = ["", *names]
    return per_cell


def _cache_for(
    args: argparse.Namespace, cells: list[Cell], options: WorldOptions,
    platforms: dict[str, Platform], mutants: bool, toolchain: dict[str, str],
) -> tuple[dict[str, Result], Callable[[Cell, Result], None] | None]:
    """Cached passes for ``cells`` and a function that stores new passes."""
    if args.no_cache:
        return {}, None
    cache = ResultCache(cache_root(args))
    keys = ActionKeys(search_path=options.project_roots)
    identity = options.runner.identity()
    allow = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
    # A spill cell's numbers also depend on the Triton (and so ptxas) version.
    compiler = {"triton": _version("triton")} if any(c.kind == "spill" for c in cells) else {}
    digests = {
        c.id: keys.digest(c, runner_identity={**identity, **(compiler if c.kind == "spill"
                                                             else {})},
                          env={**allow, **dict(platforms[c.platform].env)},
                          toolchain=toolchain)
        for c in cells
    }
    hits: dict[str, Result] = {}
    if not mutants:
        for c in cells:
            hit = cache.get(digests[c.id], c.id)
            if hit is not None:
                hits[c.id] = hit

    def store(cell: Cell, result: Result) -> None:
        try:
            cache.put(digests[cell.id], result)
        except OSError as exc:  # a full or read-only cache must not fail the run
            print(f"warning: could not store {cell.id} in the cache: {exc}", file=sys.stderr)

    return hits, store


def _write_html(out: Path) -> None:
    """report.html beside report.xml; a rendering problem never fails the run."""
    from cpmatrix.gate import ReportError
    from cpmatrix.report.html import write_html

    try:
        write_html(out / "report.xml", out / "report.html")
    except (ReportError, OSError) as exc:
        print(f"warning: report.html not written: {exc}", file=sys.stderr)


def cache_root(args: argparse.Namespace) -> Path:
    return Path(args.cache_dir).resolve() if args.cache_dir else default_cache_dir()


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "absent"


def _print_plan(cells: list[Cell], args: argparse.Namespace, out: Path,
                left_out: list[tuple[Cell, str]]) -> None:
    spill = [c for c in cells if c.kind == "spill"]
    batches = plan_batches([c for c in cells if c.kind != "spill"],
                           durations=load_durations(out), batch_size=args.batch_size,
                           keep_order=args.keep_order)
    print(f"plan: {len(cells)} cells in {len(batches)} worlds (runner: {args.runner})")
    for b in batches:
        print(f"world {b.name}: {b.world_size} ranks, {len(b.cells)} cells")
        for c in b.cells:
            print(f"  {c.id}  timeout={c.timeout_s}s")
    if spill:
        print(f"spill gates (compiled in one subprocess, no world): {len(spill)} cells")
        for c in spill:
            print(f"  {c.id}")
    if left_out:
        print(f"skipped (not run on this host, reported as skipped): {len(left_out)} cells")
        for c, why in left_out:
            print(f"  {c.id}  {why}")


def _nothing_fits(skipped: int, gpus: int) -> str:
    return (f"nothing to run: each of the {skipped} selected cells needs more GPUs than the "
            f"{gpus} visible (one rank per GPU; select narrower meshes, e.g. -k 1x1)")


def cmd_run(args: argparse.Namespace) -> int:

    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError("--batch-size must be >= 1")
    if args.jobs < 1:
        raise UsageError("--jobs must be >= 1")
    out = Path(args.out).resolve()
    # Claim --out first: whatever happens next (a spec error included), the folder can no
    # longer hold the previous run's report for a gate to read as this run's.
    claim = None if args.dry_run else claim_out(out)
    try:
        return _run(args, out, claim)
    finally:
        if claim is not None:
            claim.release()


def _run(args: argparse.Namespace, out: Path, claim: OutClaim | None) -> int:
    from cpmatrix.cli import nothing_selected, select_from_args

    matrix, expansion, cells = select_from_args(args)
    if args.only_kind:
        cells = [c for c in cells if c.kind == args.only_kind]
    if not cells:
        print(nothing_selected(args, len(expansion.cells)), file=sys.stderr)
        return ExitCode.NOTHING_SELECTED
    platforms = {p.name: p for p in matrix.platforms}
    if args.gpus is not None and args.gpus < 0:
        raise UsageError(f"--gpus must be >= 0, got {args.gpus}")
    cuda = {p.name for p in matrix.platforms if p.device == "cuda"}
    needs_cuda = any(c.platform in cuda and c.kind != "spill" for c in cells)
    gpus = args.gpus if args.gpus is not None else (visible_cuda_devices() if needs_cuda else 0)
    # One GPU per rank (nccl): cuda cells wider than the GPUs are skipped, not run; the
    # report holds them as skipped, so a gate still fails on them (docs/gpu.md).
    selected = cells
    left_out: list[tuple[Cell, str]] = []
    if needs_cuda and gpus > 0:
        cells, left_out = fit_to_devices(cells, device_platforms=cuda, devices=gpus)
    if args.dry_run:
        _print_plan(cells, args, out, left_out)
        if needs_cuda and gpus == 0:
            print("note: no CUDA device is visible here, so a real run exits 2; "
                  "--gpus N plans for a host with N GPUs")
        if not cells:
            print(_nothing_fits(len(left_out), gpus), file=sys.stderr)
            return ExitCode.NOTHING_SELECTED
        return ExitCode.OK
    assert claim is not None
    if needs_cuda and gpus == 0:
        raise UsageError("the selection has cuda cells but no CUDA device is visible "
                         "(use --dry-run to check the plan on a CPU machine)")
    if needs_cuda and args.gpus is not None:
        seen = visible_cuda_devices()
        if seen < args.gpus:
            print(f"warning: --gpus {args.gpus}, but {seen} CUDA devices are visible here: "
                  "a world given a device that is not there fails", file=sys.stderr)
    if left_out:
        print(f"skipping {len(left_out)} cuda cells wider than the {gpus} GPU(s) visible "
              "(one rank per GPU); they are reported as skipped", file=sys.stderr)
    runner, why = resolve_runner(args.runner, platforms[selected[0].platform])
    print(f"runner: {runner.name} ({why})", flush=True)
    toolchain = interpreter_identity(args.python)
    mutants = discover_mutants(matrix, cells, args.python) if args.mutants else None
    options = make_world_options(matrix, out, runner, abort_grace=args.abort_grace,
                                 python=args.python, run_id=claim.run_id)
    cached, store = _cache_for(args, cells, options, platforms, mutants is not None, toolchain)
    atomic_write_json(out / "run.json", {"run_id": claim.run_id, "argv": sys.argv,
                                         "toolchain": toolchain, "runner": runner.name})
    progress = Progress(force_plain=args.plain)
    with stop_on_signals() as stopper:
        try:
            report = run_cells(
                cells, platforms, options, batch_size=args.batch_size, jobs=args.jobs,
                devices=gpus, mutants=mutants, keep_order=args.keep_order, cached=cached,
                store=store, spill_cache=None if args.no_cache else cache_root(args) / "spill",
                on_start=progress.start, on_result=progress.update, stopper=stopper,
                skipped=left_out,
            )
        finally:
            progress.stop()
        _write_html(out)
        print(format_summary(report, os.path.relpath(out)))
        if mutants is not None:
            print(report.mutant_line())
    stopped = report.stopped_by or stopper.signum
    if stopped is not None:
        print(f"stopped by {signal.Signals(stopped).name}: unfinished cells are reported as "
              "interrupted", file=sys.stderr)
        return exit_code_for(stopped)
    if not cells:
        print(_nothing_fits(len(left_out), gpus) + "; the report lists them as skipped",
              file=sys.stderr)
        return ExitCode.NOTHING_SELECTED
    # A skipped cell is not ok either: 0 means every selected cell passed.
    return ExitCode.OK if all(r.status.ok for r in report.results.values()) else ExitCode.FAILURES
