"""Runs spill cells in a process of their own (Triton's compiler is not thread-safe and
must not see ``TRITON_INTERPRET``). Standard library + :mod:`cpmatrix.spill` only.

    python -m cpmatrix.remote.compile_main JOB.json

``JOB.json``: ``{"cells": [{"id", "spill": {...}}], "progress": DIR, "cache_dir": DIR|null,
"search_path": [...]}``. For each cell, ``DIR/<i>.start`` then ``DIR/<i>.done`` (atomic)
with the verdict and the measured numbers.
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from cpmatrix.fsutil import atomic_write_json, read_json
from cpmatrix.spill import SpillError, SpillSpec, compile_and_measure


def build_spec(spill: dict[str, Any], search_path: list[str]) -> SpillSpec:
    """A SpillSpec from a cell's spill JSON (``table`` mode reads the module's table)."""
    kernel = spill["kernel"]
    signature = dict(spill["signature"])
    constexprs = dict(spill["constexprs"])
    num_warps, num_stages = spill["num_warps"], spill["num_stages"]
    if spill.get("table"):
        module, _, attr = kernel.partition(":")
        for p in reversed(search_path):
            if p not in sys.path:
                sys.path.insert(0, p)
        try:
            table = getattr(importlib.import_module(module), spill["table"])
            entry = table[attr]
        except (ImportError, AttributeError, KeyError) as exc:
            raise SpillError(f"{kernel}: no entry {attr!r} in {module}.{spill['table']} "
                             f"({type(exc).__name__}: {exc})") from None
        signature = dict(entry.get("signature", {}))
        constexprs = {**dict(entry.get("constexprs", {})), **constexprs}
        options = dict(entry.get("options", {}))
        num_warps = options.get("num_warps", num_warps)
        num_stages = options.get("num_stages", num_stages)
    return SpillSpec(kernel=kernel, signature=signature, constexprs=constexprs,
                     arch=spill["arch"], num_warps=num_warps, num_stages=num_stages,
                     budget_bytes=spill["budget_bytes"], expect_spill=spill["expect_spill"])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    job = read_json(args[0])
    progress = Path(job["progress"])
    cache_dir = Path(job["cache_dir"]) if job.get("cache_dir") else None
    search_path = list(job.get("search_path", []))
    for i, cell in enumerate(job["cells"]):
        atomic_write_json(progress / f"{i}.start", {"id": cell["id"], "time": time.time()})
        t0 = time.monotonic()
        out: dict[str, Any] = {"id": cell["id"]}
        try:
            spec = build_spec(cell["spill"], search_path)
            report = compile_and_measure(spec, cache_dir=cache_dir, search_path=search_path)
            verdict = report.verdict()
            out.update(status="ok" if verdict.passed else "error", message=verdict.message,
                       evidence=report.evidence())
        except SpillError as exc:
            out.update(status="error", message=f"SpillError: {exc}", evidence={})
        except Exception as exc:  # a bug in the gate itself: report, keep going
            out.update(status="error", message=f"{type(exc).__name__}: {exc}",
                       traceback=traceback.format_exc(), evidence={})
        out["duration_s"] = time.monotonic() - t0
        atomic_write_json(progress / f"{i}.done", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
