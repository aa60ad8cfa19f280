"""The one-line summary of ``scripts/gpu-check.sh``, from what its steps left in OUT.

    python3 scripts/gpu_check/summarize.py OUT [--rehearsal]

Reads ``OUT/steps.tsv`` (name, exit code, wall seconds; written by the script), each
step's ``results.json`` and ``OUT/crosscheck.json``; prints the line, writes it to
``OUT/summary.txt`` and every figure to ``OUT/summary.json``. Exits 1 when a step failed
(a required step is missing, or exited non-zero), else 0. Standard library only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OK = ("passed", "cached")
#: Steps whose absence is a failure (the rest depend on --quick or on the matrices there).
REQUIRED = ("cuda-1x1", "spill-gate", "crosscheck", "world-nccl")


def read_steps(out: Path) -> dict[str, tuple[int, float]]:
    steps: dict[str, tuple[int, float]] = {}
    path = out / "steps.tsv"
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            name, rc, seconds = line.split("\t")
            steps[name] = (int(rc), float(seconds))
    return steps


def results(out: Path, step: str) -> list[dict[str, Any]]:
    path = out / step / "results.json"
    if not path.is_file():
        return []
    data: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    return data


def tally(rows: list[dict[str, Any]]) -> dict[str, int]:
    passed = sum(r["status"] in OK for r in rows)
    skipped = sum(r["status"] == "skipped" for r in rows)
    return {"passed": passed, "skipped": skipped, "failed": len(rows) - passed - skipped}


def cell_seconds(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """(sum of the cells' own durations, the same without the run's first cell: warm-up)."""
    durations = [float(r["duration_s"]) for r in rows]
    return sum(durations), sum(durations[1:])


def summarize(out: Path, rehearsal: bool = False) -> tuple[str, dict[str, Any], bool]:
    """(the line, every figure, whether every step passed)."""
    steps = read_steps(out)
    failed_steps = [f"{name} (exit {rc})" for name, (rc, _) in steps.items() if rc != 0]
    failed_steps += [f"{name} (not run)" for name in REQUIRED if name not in steps]
    figures: dict[str, Any] = {"steps": {k: {"exit": rc, "seconds": s}
                                         for k, (rc, s) in steps.items()}}

    cuda_steps = ["cuda-1x1", *sorted(k for k in steps if k.startswith("recipe-"))]
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for step in cuda_steps:
        for key, n in tally(results(out, step)).items():
            counts[key] += n
    figures["cuda_cells"] = counts
    platform = "cpu" if rehearsal else "cuda"
    parts = [f"{counts['passed']} {platform} cells passed, {counts['failed']} failed"
             + (f", {counts['skipped']} skipped" if counts["skipped"] else "")]

    gate = tally(results(out, "spill-gate"))
    figures["spill_gate"] = gate
    cross_path = out / "crosscheck.json"
    if cross_path.is_file():
        cross = json.loads(cross_path.read_text(encoding="utf-8"))
        figures["crosscheck"] = cross
        crosscheck = (f"{cross['matched']}/{cross['total']} kernels match on {cross['device']} "
                      f"({cross['arch']})")
    else:
        rc = steps.get("crosscheck", (None, 0.0))[0]
        crosscheck = ("not run" if rc is None
                      else "kernels listed only (rehearsal)" if rehearsal and rc == 0
                      else f"failed (exit {rc}, no crosscheck.json)")
    parts.append(f"spill crosscheck: {crosscheck}; ptxas gate {gate['passed']}/"
                 f"{sum(gate.values())} passed")

    # Compiled: the cuda kernel-path 1x1 cells; --quick has no run of their own, so they
    # are taken from step 1 (which then selected exactly them).
    compiled_rows = results(out, "timing-compiled") or [
        r for r in results(out, "cuda-1x1") if ",kernel," in r["cell_id"]]
    interpreted_rows = results(out, "timing-interpreted")
    compiled, compiled_warm = cell_seconds(compiled_rows)
    interpreted, interpreted_warm = cell_seconds(interpreted_rows)
    figures["timing"] = {
        "compiled_cells": len(compiled_rows), "compiled_s": round(compiled, 3),
        "compiled_without_first_s": round(compiled_warm, 3),
        "interpreted_cells": len(interpreted_rows), "interpreted_s": round(interpreted, 3),
        "interpreted_without_first_s": round(interpreted_warm, 3),
    }
    if compiled_rows and interpreted_rows:
        ratio = f"{interpreted / compiled:.1f}x" if compiled > 0 else "n/a"
        parts.append(f"compiled vs interpreted: {compiled:.1f} s vs {interpreted:.1f} s "
                     f"({ratio}, {len(compiled_rows)} vs {len(interpreted_rows)} kernel cells)")
    elif compiled_rows:
        parts.append(f"compiled: {compiled:.1f} s ({len(compiled_rows)} kernel cells; "
                     "interpreted not run)")
    else:
        parts.append("compiled vs interpreted: not measured")

    world = steps.get("world-nccl")
    gloo = steps.get("world-gloo")
    if world is not None and world[0] == 0:
        parts.append(f"nccl world start: {world[1]:.1f} s"
                     + (f" (gloo: {gloo[1]:.1f} s)" if gloo is not None and gloo[0] == 0
                        else ""))
    else:
        parts.append("nccl world start: " + ("not run" if world is None
                                             else f"failed (exit {world[0]})"))
    if failed_steps:
        parts.append("FAILED: " + ", ".join(failed_steps))
    figures["failed_steps"] = failed_steps
    line = ("gpu-check REHEARSAL (cpu platform, no GPU): " if rehearsal
            else "gpu-check: ") + "; ".join(parts)
    figures["summary"] = line
    return line, figures, not failed_steps


def main(argv: list[str]) -> int:
    rehearsal = "--rehearsal" in argv
    args = [a for a in argv if a != "--rehearsal"]
    if len(args) != 1:
        print("usage: summarize.py OUT [--rehearsal]", file=sys.stderr)
        return 2
    out = Path(args[0])
    line, figures, ok = summarize(out, rehearsal)
    (out / "summary.txt").write_text(line + "\n", encoding="utf-8")
    (out / "summary.json").write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
