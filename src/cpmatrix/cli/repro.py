"""``cpmatrix repro CELL_ID``: rerun exactly one cell (or the last run's failures),
streaming its output.

The cell's seed comes from its id and its environment from the allow-list, so a
repro draws the same numbers as the run the id came from (fp64 evidence is
bit-identical on the same platform). The command that ran is printed so it can be
pasted (``docker run ...`` / ``bwrap ...`` / ``python -m torch.distributed.run ...``).

A cell is named by its id, or by any prefix of it that names one cell
(:mod:`cpmatrix.cli.cellref`); ``--failed`` reruns the cells that did not pass when they
last ran in ``--from`` (by default the project's ``out``; its ``last-failed.json``, see
:mod:`cpmatrix.report.last_failed`), ``-k``
the cells an expression selects; several cells run together in one world.

Example::

    $ cpmatrix repro 'ring_attention[unit,2x2,fp64,autocast=off,reference,seq=7]@cpu' \\
          --runner docker
    $ cpmatrix repro --failed
    $ cpmatrix repro 'ring_attention[unit,2x2'
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from cpmatrix.cli.cellref import NotFound, resolve_id
from cpmatrix.cli.common import (
    absolute_path,
    add_command,
    add_matrix,
    keyword_hints,
    load_and_expand,
    matrix_of,
)
from cpmatrix.cli.console import format_summary
from cpmatrix.cli.run import repro_flags
from cpmatrix.errors import ExitCode, UsageError
from cpmatrix.kinds.executors import EXECUTORS
from cpmatrix.layout import RunLayout
from cpmatrix.matrix.case_check import check_cases
from cpmatrix.matrix.schema import Cell, Matrix
from cpmatrix.matrix.select import select_cells
from cpmatrix.report.last_failed import FailedEntry, read_last_failed
from cpmatrix.result import Status, read_results
from cpmatrix.suggest import did_you_mean
from cpmatrix.supervise.declared_mutants import discover_mutants
from cpmatrix.supervise.options import RunOptions, add_run_arguments
from cpmatrix.supervise.pipeline import check_options, reproduce
from cpmatrix.worker.protocol import WorldFolder

__all__ = ["LogStreamer", "add_parsers", "failed_in", "run"]

#: Settings that mean nothing for a few cells rerun once, here (the cache too: a repro
#: always runs; the scheduler and shards too: a repro runs one world on this host).
_NOT_FOR_REPRO = ("batch_size", "jobs", "mutants", "dry_run", "keep_order", "order", "no_cache",
                  "cache_dir", "plain", "runs_per_test", "shard", "durations_from", "scheduler",
                  "partition", "account", "max_jobs", "slurm_args", "pending_timeout_s",
                  "maxfail", "failed_first", "remote_cache", "remote_cache_read_only")


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "repro", "rerun one cell (or the last run's failures), streaming its output",
        "Rerun exactly the cells named, with the setup of `cpmatrix run` (runner, "
        "interpreter), never cached, streaming every rank's log. CELL is a cell id or a "
        "prefix of exactly one. A failure's block ends with the line to paste here.",
        ["cpmatrix repro 'allreduce_sum[unit,2x2,fp64,autocast=off,reference]@cpu'",
         "cpmatrix repro 'allreduce_sum[unit,2x2,fp64'       # a prefix of one id",
         "cpmatrix repro --failed                            # the last run's failures",
         "cpmatrix repro -k \"2x2 and fp32\"",
         "cpmatrix repro CELL --mutant no_allreduce           # with a planted bug",
         "cpmatrix repro CELL --runner docker"])
    p.add_argument("cell_id", nargs="?", metavar="CELL",
                   help="a cell id, or a prefix of exactly one")
    p.add_argument("--failed", action="store_true",
                   help="rerun the cells that did not pass when they last ran in --from "
                   "(a later run that did not run them does not hide them)")
    p.add_argument("-k", dest="keyword", metavar="EXPR",
                   help="rerun the cells this -k expression selects")
    p.add_argument("--from", dest="from_dir", type=absolute_path, default=None, metavar="DIR",
                   help="with --failed: the run's output folder (default: out of "
                   "[tool.cpmatrix], else ./out)")
    add_matrix(p)
    p.add_argument("--mutant", default="", help="switch this declared mutant on")
    add_run_arguments(p, exclude=_NOT_FOR_REPRO)
    p.set_defaults(handler=run, out="out/repro", no_cache=True, plain=True, platform=None,
                   tag=[])


class LogStreamer(threading.Thread):
    """Copies every rank's log (and the launcher's) to ``stream`` as it grows."""

    def __init__(self, worlds_dir: Path, stream: TextIO) -> None:
        super().__init__(daemon=True)
        self.worlds_dir = worlds_dir
        self.stream = stream
        self.offsets: dict[Path, int] = {}
        self.printed_commands: set[Path] = set()
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.is_set():
            self.pump()
            time.sleep(0.1)
        self.pump()

    def pump(self) -> None:
        worlds = [WorldFolder(p) for p in sorted(self.worlds_dir.glob("*/"))]
        for command in (w.command_file for w in worlds):
            if command in self.printed_commands or not command.is_file():
                continue
            self.printed_commands.add(command)
            try:
                argv = json.loads(command.read_text())["argv"]
            except (OSError, ValueError, KeyError):
                continue
            print(f"$ {shlex.join(argv)}", file=self.stream, flush=True)
        # Every world's rank logs, then the launchers' (the order a pump has printed in).
        logs = ([(log, log.stem) for w in worlds for log in w.rank_logs()]
                + [(w.launcher_log, "launcher") for w in worlds])
        for log, who in logs:
            start = self.offsets.get(log, 0)
            try:
                with open(log, "rb") as f:
                    f.seek(start)
                    data = f.read()
            except OSError:
                continue
            if not data:
                continue
            # Only whole lines; the rest waits for the next pump.
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                continue
            self.offsets[log] = start + cut
            for line in data[:cut].decode("utf-8", errors="replace").splitlines():
                print(f"[{who}] {line}", file=self.stream, flush=True)

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(timeout=5)


def failed_in(folder: Path) -> list[FailedEntry]:
    """The cells that did not pass when they last ran in ``folder``: its
    ``last-failed.json`` (:mod:`cpmatrix.report.last_failed`); a folder without one (a
    ``merge``'s) by its ``results.json``, the one run it holds."""
    try:
        record = read_last_failed(folder)
    except ValueError as exc:
        raise UsageError(f"--failed: {exc}") from None
    if record is not None:
        return record
    path = RunLayout(folder).results
    try:
        results = read_results(path)
    except FileNotFoundError:
        raise UsageError(f"--failed: no run has reported in {folder} (no "
                         f"{RunLayout(folder).last_failed.name} or {path.name}; run first, "
                         "or give --from DIR)") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--failed: {path} cannot be read: {exc}") from None
    return [FailedEntry(cell_id=r.cell_id, mutant=r.mutant, status=r.status.value, at=0.0)
            for r in results
            if not r.status.ok and r.status not in (Status.SKIPPED, Status.INTERRUPTED)]


def _chosen(args: argparse.Namespace) -> tuple[object, list[Cell], str] | int:
    """The matrix, the cells to rerun and the mutant; an exit code when there are none."""
    given = sum(bool(x) for x in (args.cell_id, args.failed, args.keyword))
    if given != 1:
        raise UsageError("name what to rerun: a CELL id (or a prefix of one), --failed, or "
                         "-k EXPR (one of them)")
    matrix, expansion = load_and_expand(matrix_of(args))
    ids = [c.id for c in expansion.cells]
    by_id = {c.id: c for c in expansion.cells}
    mutant = args.mutant
    if args.cell_id:
        try:
            cells = [by_id[resolve_id(args.cell_id, ids)]]
        except NotFound as exc:
            print(f"{exc} in {args.matrix} (see `cpmatrix list`)", file=sys.stderr)
            return ExitCode.NOTHING_SELECTED
    elif args.keyword:
        cells = select_cells(expansion.cells, keyword=args.keyword)
        if not cells:
            hints = "".join(f"\n  {h}" for h in keyword_hints(args, expansion))
            print(f"nothing selected: -k {args.keyword!r} matched none of the "
                  f"{len(ids)} cells in {args.matrix}{hints}", file=sys.stderr)
            return ExitCode.NOTHING_SELECTED
    else:
        folder = Path(args.from_dir or "out")
        failed = failed_in(folder)
        unknown = sorted({r.cell_id for r in failed} - set(by_id))
        if unknown:
            print(f"note: {len(unknown)} failed cell(s) are not in {args.matrix} now: "
                  + ", ".join(unknown[:5]), file=sys.stderr)
        cells = list({r.cell_id: by_id[r.cell_id] for r in failed if r.cell_id in by_id}
                     .values())
        if not cells:
            print(f"nothing to rerun: no cell failed when it last ran in {folder}",
                  file=sys.stderr)
            return ExitCode.NOTHING_SELECTED
        mutants = {r.mutant for r in failed if r.mutant}
        if len(cells) == 1 and len(mutants) == 1 and not mutant:
            mutant = mutants.pop()  # a survived mutant: its run is what failed
    if mutant and len(cells) != 1:
        raise UsageError(f"--mutant goes with one cell; {len(cells)} are selected")
    check_cases(matrix, cells)
    return matrix, cells, mutant


def run(args: argparse.Namespace) -> int:
    """The same setup as ``cpmatrix run`` (runner, interpreter, devices), for its cells."""
    options = RunOptions.from_namespace(args)
    check_options(options)
    chosen = _chosen(args)
    if isinstance(chosen, int):
        return chosen
    matrix, cells, mutant = chosen
    if args.mutant:
        _check_mutant(matrix, cells[0], args.mutant, options.python)  # type: ignore[arg-type]
    if len(cells) > 1:
        print(f"repro: {len(cells)} cells in one world: "
              + ", ".join(c.id for c in cells[:5]) + (" ..." if len(cells) > 5 else ""))
    done = reproduce(options, matrix, cells, mutant=mutant,  # type: ignore[arg-type]
                     hooks=_Streaming(args, [c.id for c in cells], mutant),
                     executors=EXECUTORS)
    if done.report is None:
        return done.code
    print(format_summary(done.report, str(Path(options.out).resolve())))
    if done.result is not None and len(cells) == 1:
        for key, value in done.result.evidence.items():
            print(f"evidence {key} = {value!r}")
    return done.code


def _check_mutant(matrix: Matrix, cell: Cell, mutant: str, python: str) -> None:
    """``--mutant`` names one the cell's case declares (read in a child of ``python``),
    or exit 2 with the declared ones and the nearest: never a run that "survives" a
    mutant that does not exist."""
    declared = [m for m in discover_mutants(matrix.pythonpath, [cell], python,
                                            executors=EXECUTORS)[cell.id] if m]
    if mutant not in declared:
        allowed = ", ".join(declared) if declared else "none: its case declares no mutant"
        raise UsageError(f"--mutant {mutant!r}: {cell.case} declares no such mutant for "
                         f"{cell.id} (declared: {allowed}){did_you_mean(mutant, declared)}")


def _without_runner(flags: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    skip = False
    for f in flags:
        if skip:
            skip = False
        elif f == "--runner":
            skip = True
        else:
            out.append(f)
    return out


class _Streaming:
    """repro's lines, the command to paste, every log streamed while the cells run."""

    def __init__(self, args: argparse.Namespace, ids: list[str], mutant: str) -> None:
        self.args = args
        self.ids = ids
        self.mutant = mutant

    def say(self, line: str) -> None:
        print(line)

    def warn(self, line: str) -> None:
        print(line, file=sys.stderr)

    def ready(self, runner: str) -> None:
        flags = [f for f in _without_runner(repro_flags(self.args))] + ["--runner", runner]
        for cell_id in self.ids:
            paste = ["cpmatrix", "repro", cell_id] + (
                ["--mutant", self.mutant] if self.mutant else []) + flags
            print(f"repro: {shlex.join(paste)}")

    @contextmanager
    def watching(self, out: Path) -> Iterator[object]:
        streamer = LogStreamer(RunLayout(out).worlds, sys.stdout)
        streamer.start()
        try:
            yield streamer
        finally:
            streamer.stop()
