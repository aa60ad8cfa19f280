"""Targets for ``python -m cpmatrix.worker.forkrun -m fork_targets_*`` in tests."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    """Write this rank's pid and environment, then do what ``argv[1]`` says."""
    out, what = Path(argv[0]), argv[1]
    rank = os.environ["RANK"]
    (out / f"rank{rank}.pid").write_text(
        f"{os.getpid()} {os.environ['WORLD_SIZE']} {os.environ['MASTER_PORT']}\n")
    if what == "sleep":
        time.sleep(600)
    if what == "exit7_rank1" and rank == "1":
        # Only once every rank is up: the test checks that the launcher kills them all.
        end = time.monotonic() + 120
        while len(list(out.glob("rank*.pid"))) < int(os.environ["WORLD_SIZE"]):
            if time.monotonic() > end:
                break
            time.sleep(0.05)
        sys.exit(7)
    if what == "exit7_rank1":
        time.sleep(600)  # the launcher must take the others down
    return 0
