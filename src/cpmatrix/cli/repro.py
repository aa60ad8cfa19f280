"""``cpmatrix repro CELL_ID``: rerun exactly one cell, streaming its output.

The cell's seed comes from its id and its environment from the allow-list, so a
repro draws the same numbers as the run the id came from (fp64 evidence is
bit-identical on the same platform). The command that ran is printed so it can be
pasted (``docker run ...`` / ``bwrap ...`` / ``python -m torch.distributed.run ...``).

Example::

    $ cpmatrix repro 'ring_attention[unit,2x2,fp64,autocast=off,reference,seq=7]@cpu' \\
          --runner docker
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from cpmatrix.cli.common import DEFAULT_MATRIX, load_and_expand
from cpmatrix.cli.console import format_summary
from cpmatrix.errors import ExitCode
from cpmatrix.layout import RunLayout
from cpmatrix.remote.protocol import WorldFolder
from cpmatrix.run.options import RunOptions, add_run_arguments
from cpmatrix.run.outdir import claim_out
from cpmatrix.run.session import run_cells
from cpmatrix.run.setup import prepare_run
from cpmatrix.run.stopping import exit_code_for, stop_on_signals

__all__ = ["LogStreamer", "add_parsers", "run"]

#: Settings that mean nothing for one cell run once (the cache too: a repro always runs).
_NOT_FOR_REPRO = ("batch_size", "jobs", "mutants", "dry_run", "keep_order", "order", "no_cache",
                  "cache_dir", "plain", "runs_per_test")


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("repro", help="rerun exactly one cell, streaming its output")
    p.add_argument("cell_id")
    p.add_argument("--matrix", default=DEFAULT_MATRIX)
    p.add_argument("--mutant", default="", help="switch this declared mutant on")
    add_run_arguments(p, exclude=_NOT_FOR_REPRO)
    p.set_defaults(handler=run, out="out/repro", no_cache=True, plain=True)


class LogStreamer(threading.Thread):
    """Copies every rank's log (and torchrun's) to ``stream`` as it grows."""

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
        for log in [log for w in worlds for log in w.logs()]:
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
            who = log.stem if log.stem != "torchrun" else "launcher"
            for line in data[:cut].decode("utf-8", errors="replace").splitlines():
                print(f"[{who}] {line}", file=self.stream, flush=True)

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(timeout=5)


def run(args: argparse.Namespace) -> int:
    """The same setup as ``cpmatrix run`` (runner, interpreter, devices), for one cell."""
    options = RunOptions.from_namespace(args)
    matrix, expansion = load_and_expand(args.matrix)
    cell = next((c for c in expansion.cells if c.id == args.cell_id), None)
    if cell is None:
        print(f"no cell {args.cell_id!r} in {args.matrix} (see `cpmatrix list`)", file=sys.stderr)
        return ExitCode.NOTHING_SELECTED
    out = Path(options.out).resolve()
    claim = claim_out(out)
    try:
        prepared = prepare_run(options, matrix, [cell], claim)
        if not prepared.cells:
            (_, why), = prepared.skipped
            print(f"{cell.id}: cannot run here: {why}", file=sys.stderr)
            return ExitCode.USAGE
        print(f"runner: {prepared.runner.name} ({prepared.why_runner})")
        paste = ["cpmatrix", "repro", cell.id, "--matrix", args.matrix,
                 "--runner", prepared.runner.name] + (
                     ["--mutant", args.mutant] if args.mutant else [])
        print(f"repro: {shlex.join(paste)}")
        streamer = LogStreamer(RunLayout(out).worlds, sys.stdout)
        # the unmutated cell first: a mutant is judged only against a green cell
        mutants = {cell.id: ["", args.mutant]} if args.mutant else None
        streamer.start()
        try:
            with stop_on_signals() as stopper:
                report = run_cells([cell], prepared.platforms, prepared.context,
                                   devices=prepared.devices, mutants=mutants, stopper=stopper)
        finally:
            streamer.stop()
    finally:
        claim.release()
    print(format_summary(report, str(out)))
    if report.stopped_by is not None:
        return exit_code_for(report.stopped_by)
    result = list(report.results.values())[-1]  # the mutant run, with --mutant
    for key, value in sorted(result.evidence.items()):
        print(f"evidence {key} = {value!r}")
    return ExitCode.OK if result.status.ok else ExitCode.FAILURES
