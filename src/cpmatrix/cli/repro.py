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

__all__ = ["LogStreamer", "add_repro_parser", "cmd_repro"]


def add_repro_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("repro", help="rerun exactly one cell, streaming its output")
    p.add_argument("cell_id")
    p.add_argument("--matrix", default="matrix/parity.yaml")
    p.add_argument("--runner", default="local", help="local | sandbox | docker | auto")
    p.add_argument("--out", default=None, help="output folder (default: out/repro)")
    p.add_argument("--mutant", default="", help="switch this declared mutant on")


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
        for command in sorted(self.worlds_dir.glob("*/command.json")):
            if command in self.printed_commands:
                continue
            self.printed_commands.add(command)
            try:
                argv = json.loads(command.read_text())["argv"]
            except (OSError, ValueError, KeyError):
                continue
            print(f"$ {shlex.join(argv)}", file=self.stream, flush=True)
        for log in sorted(self.worlds_dir.glob("*/rank*.log")) + sorted(
                self.worlds_dir.glob("*/torchrun.log")):
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


def cmd_repro(args: argparse.Namespace) -> int:
    from cpmatrix.cli import load_and_expand
    from cpmatrix.cli.console import format_summary
    from cpmatrix.cli.run import make_world_options
    from cpmatrix.errors import ExitCode
    from cpmatrix.run.outdir import claim_out
    from cpmatrix.run.runners import resolve_runner
    from cpmatrix.run.session import run_cells
    from cpmatrix.run.stopping import exit_code_for, stop_on_signals

    matrix, expansion = load_and_expand(args.matrix)
    cell = next((c for c in expansion.cells if c.id == args.cell_id), None)
    if cell is None:
        print(f"no cell {args.cell_id!r} in {args.matrix} (see `cpmatrix list`)", file=sys.stderr)
        return ExitCode.NOTHING_SELECTED
    platforms = {p.name: p for p in matrix.platforms}
    runner, why = resolve_runner(args.runner, platforms[cell.platform])
    print(f"runner: {runner.name} ({why})")
    out = Path(args.out or "out/repro").resolve()
    claim = claim_out(out)
    options = make_world_options(matrix, out, runner, abort_grace=5.0, run_id=claim.run_id)
    paste = [
        "cpmatrix", "repro", cell.id, "--matrix", args.matrix, "--runner", runner.name,
    ] + (["--mutant", args.mutant] if args.mutant else [])
    print(f"repro: {shlex.join(paste)}")
    streamer = LogStreamer(out / "worlds", sys.stdout)
    mutants = {cell.id: [args.mutant]} if args.mutant else None
    streamer.start()
    try:
        with stop_on_signals() as stopper:
            report = run_cells([cell], platforms, options, mutants=mutants, stopper=stopper)
    finally:
        streamer.stop()
        claim.release()
    print(format_summary(report, str(out)))
    if report.stopped_by is not None:
        return exit_code_for(report.stopped_by)
    result = next(iter(report.results.values()))
    for key, value in sorted(result.evidence.items()):
        print(f"evidence {key} = {value!r}")
    return ExitCode.OK if result.status.ok else ExitCode.FAILURES
