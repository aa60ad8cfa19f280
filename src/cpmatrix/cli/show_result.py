"""``cpmatrix show CELL``'s view of a cell's last result, read from a run's folder.

The status and the failure block a run prints (:func:`cpmatrix.cli.failures.failure_block`:
the message, the failing ranks with their traceback once, the evidence by rank, the
repro line), then where the cell's logs are. Read from ``results.json`` of the run's
``--out`` (the project's ``out`` by default): the last run that reported the cell.

Example::

    >>> from cpmatrix.result import Result, Status
    >>> r = Result(cell_id="t@cpu", status=Status.PASSED, duration_s=0.5,
    ...            evidence={"max_abs_err": 0.0})
    >>> print("\\n".join(result_lines(r, Path("out"))))
    PASSED t@cpu in 0.50 s
      evidence (all ranks): max_abs_err = 0.0
"""

from __future__ import annotations

from pathlib import Path

from cpmatrix.cli.failures import failure_block
from cpmatrix.layout import RunLayout, cell_output_logs
from cpmatrix.result import Result, read_results, testcase_name

__all__ = ["last_results", "result_lines"]


def last_results(out: Path, cell_id: str) -> list[Result]:
    """The results of ``cell_id`` in ``out``'s ``results.json`` (its plain run first,
    then its mutant runs); empty when the folder holds no report of it."""
    try:
        results = read_results(RunLayout(out).results)
    except (OSError, ValueError):
        return []
    return sorted((r for r in results if r.cell_id == cell_id), key=lambda r: bool(r.mutant))


def result_lines(r: Result, out: Path, *, full_trace: bool = False) -> list[str]:
    """The result as ``show`` prints it, with its logs under ``out``."""
    name = testcase_name(r.cell_id, r.mutant)
    if r.status.ok:
        lines = [f"{r.status.label} {name} in {r.duration_s:.2f} s"]
        lines += [ln for ln in failure_block(name, r)[2:]
                  if ln.startswith("  evidence")]
    else:
        lines = failure_block(name, r, full_trace=full_trace)
        lines.insert(1, f"  time: {r.duration_s:.2f} s")
    if r.source.get("machine"):  # what the result may depend on of the hardware
        lines.append(f"  machine: {r.source['machine']}")
    logs = cell_output_logs(out / r.out_dir) if r.out_dir else {}
    for rank, log in logs.items():
        lines.append(f"  log rank {rank}: {log}")
    return lines
