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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from cpmatrix.cli.common import DEFAULT_MATRIX, load_and_expand
from cpmatrix.cli.console import format_summary
from cpmatrix.errors import ExitCode
from cpmatrix.layout import RunLayout
from cpmatrix.remote.protocol import WorldFolder
from cpmatrix.run.options import RunOptions, add_run_arguments
from cpmatrix.run.pipeline import check_options, reproduce

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


def run(args: argparse.Namespace) -> int:
    """The same setup as ``cpmatrix run`` (runner, interpreter, devices), for one cell."""
    options = RunOptions.from_namespace(args)
    check_options(options)
    matrix, expansion = load_and_expand(args.matrix)
    cell = next((c for c in expansion.cells if c.id == args.cell_id), None)
    if cell is None:
        print(f"no cell {args.cell_id!r} in {args.matrix} (see `cpmatrix list`)", file=sys.stderr)
        return ExitCode.NOTHING_SELECTED
    done = reproduce(options, matrix, cell, mutant=args.mutant, hooks=_Streaming(args))
    if done.report is None:
        return done.code
    print(format_summary(done.report, str(Path(options.out).resolve())))
    if done.result is not None:
        for key, value in sorted(done.result.evidence.items()):
            print(f"evidence {key} = {value!r}")
    return done.code


class _Streaming:
    """repro's lines, the command to paste, every log streamed while the cell runs."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def say(self, line: str) -> None:
        print(line)

    def warn(self, line: str) -> None:
        print(line, file=sys.stderr)

    def ready(self, runner: str) -> None:
        a = self.args
        paste = ["cpmatrix", "repro", a.cell_id, "--matrix", a.matrix, "--runner", runner] + (
            ["--mutant", a.mutant] if a.mutant else [])
        print(f"repro: {shlex.join(paste)}")

    @contextmanager
    def watching(self, out: Path) -> Iterator[object]:
        streamer = LogStreamer(RunLayout(out).worlds, sys.stdout)
        streamer.start()
        try:
            yield streamer
        finally:
            streamer.stop()
