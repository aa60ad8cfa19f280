"""Runs spill cells in a process of their own (Triton's compiler is not thread-safe and
must not see ``TRITON_INTERPRET``). Standard library + :mod:`cpmatrix.spill` only.

    python -m cpmatrix.worker.compile_main JOB.json

``JOB.json`` is a :class:`~cpmatrix.worker.protocol.CompileJob`; for each cell it writes
the same typed markers a world's rank 0 does (:mod:`cpmatrix.worker.protocol`): a start
marker, then an outcome with the verdict and the measured numbers.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from cpmatrix.module_names import COMPILE_MAIN
from cpmatrix.spill import SpillError, compile_and_measure, spec_for_cell
from cpmatrix.worker.observe import ReadObserver
from cpmatrix.worker.procs import set_parent_death_signal
from cpmatrix.worker.protocol import (
    DONE,
    ERROR,
    OK,
    START,
    CompileFolder,
    CompileJob,
    Outcome,
    StartMarker,
    read_typed,
    write_typed,
)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    job = read_typed(args[0], CompileJob) if len(args) == 1 else None
    if job is None:
        print(f"usage: python -m {COMPILE_MAIN} JOB.json (a CompileJob)",
              file=sys.stderr)
        return 2
    set_parent_death_signal()
    folder = CompileFolder(Path(job.folder))
    cache_dir = Path(job.cache_dir) if job.cache_dir else None
    # What each cell reads completes the cache key. Not: the run's own folder (the cells'),
    # and the compile cache, whose entries are the cells' own results, keyed by what made
    # them (the kernel source, its spec, the toolchain: all in the pre-key).
    # Its one process start is ptxas (triton's, by name==version in the toolchain key),
    # whose one input is the PTX the job wrote: not followed (trust_installed).
    observer = ReadObserver(skip=(job.out_root, job.folder, job.cache_dir or ""),
                            follow=os.path.join(job.folder, "follow"), trust_installed=True)
    for i, cell in enumerate(job.cells):
        write_typed(folder.marker(i, 0, START),
                    StartMarker(index=i, rank=0, id=cell.id, run=job.run_id, time=time.time()))
        t0 = time.monotonic()
        observer.start()
        fields: dict[str, Any] = {}
        try:
            spec = spec_for_cell(cell.spill or {}, job.search_path)
            report = compile_and_measure(spec, cache_dir=cache_dir, search_path=job.search_path)
            verdict = report.verdict()
            fields = {"status": OK if verdict.passed else ERROR, "message": verdict.message,
                      "evidence": report.evidence(), "check": "" if verdict.passed else "spill"}
        except SpillError as exc:
            fields = {"status": ERROR, "message": f"SpillError: {exc}", "check": "spill"}
        except Exception as exc:  # a bug in the gate itself: report, keep going
            fields = {"status": ERROR, "message": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc(), "check": "spill"}
        reads = observer.stop()
        duration = time.monotonic() - t0
        write_typed(folder.marker(i, 0, DONE), Outcome(
            index=i, rank=0, id=cell.id, run=job.run_id, duration_s=duration,
            case_s=duration, end_time=time.time(), reads=reads, **fields))
    return 0


if __name__ == "__main__":
    sys.exit(main())
