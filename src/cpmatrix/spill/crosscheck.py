"""On a GPU: cross-check a matrix's spill gates against the kernels actually loaded.

The spill gate (``cpmatrix spill``) reads registers and spills from ``ptxas -v`` with no
GPU. This command compiles each spill cell's kernel for the device it runs on, loads it,
and compares what the driver reports (Triton's ``n_regs``/``n_spills``) with ptxas, one
line per cell (see :func:`cpmatrix.spill.crosscheck_loaded`). Only the cells whose arch is
the device's own are checked (``sm_90a`` on an H100/H200): the other archs' numbers cannot
be loaded here.

    python -m cpmatrix.spill.crosscheck [--matrix matrix/parity.yaml] [-k EXPR]
                                        [--json FILE] [--arch sm_90a --dry-run]

Exit codes: 0 every checked kernel matches, 1 a mismatch or a kernel that failed to
compile or load, 2 usage (no CUDA device, ``TRITON_INTERPRET`` set, a bad matrix), 3 no
spill cell selected for the arch. ``--dry-run --arch A`` lists what would be checked and
needs no GPU.

Example::

    $ python -m cpmatrix.spill.crosscheck -k softmax --json out/crosscheck.json
    MATCH spill_softmax_fwd[unit,1x1,...,arch=sm_90a]@cpu: registers 32 loaded = 32 ptxas; ...
    crosscheck: 2/2 kernels match on NVIDIA H200 (sm_90a)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["describe", "main"]


def describe(cell_id: str, result: dict[str, Any]) -> tuple[bool, str]:
    """``(matched, one line)`` for one cell's :func:`crosscheck_loaded` result.

    >>> describe("k", {"error": "SpillError: no such kernel"})
    (False, 'ERROR k: SpillError: no such kernel')
    """
    if "error" in result:
        return False, f"ERROR {cell_id}: {result['error']}"
    if "skipped" in result:
        return False, f"SKIPPED {cell_id}: {result['skipped']}"
    ok = bool(result["match"])
    regs = "=" if result["registers_match"] else "!="
    local = "=" if result["local_memory_match"] else "!="
    return ok, (
        f"{'MATCH' if ok else 'MISMATCH'} {cell_id}: "
        f"registers {result['loaded_n_regs']} loaded {regs} {result['ptxas_registers']} ptxas; "
        f"local memory {result['loaded_local_bytes']} B loaded {local} "
        f"{result['ptxas_stack_frame_bytes']} B ptxas stack frame; ptxas spills "
        f"{result['ptxas_spill_store_bytes']} B stores + {result['ptxas_spill_load_bytes']} B "
        "loads")


def _device() -> tuple[str | None, str]:
    """(the device's arch, its name), or (None, why there is none)."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, f"no CUDA device (torch {torch.__version__})"
    major, minor = torch.cuda.get_device_capability()
    capability = 10 * major + minor
    # As Triton names it (sm_arch_from_capability): the "a" variant from sm_90 on.
    return f"sm_{capability}{'a' if capability >= 90 else ''}", torch.cuda.get_device_name()


def _parser() -> argparse.ArgumentParser:
    """The command line (``--arch`` takes the archs the spill gate knows)."""
    from cpmatrix.module_names import SPILL_CROSSCHECK
    from cpmatrix.spill._spec import ARCHS

    p = argparse.ArgumentParser(prog=f"python -m {SPILL_CROSSCHECK}",
                                description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--matrix", default="matrix/parity.yaml")
    p.add_argument("-k", dest="keyword", metavar="EXPR", help="only spill cells matching EXPR")
    p.add_argument("--arch", choices=ARCHS, help="check the cells of this arch (default: the "
                   "device's own; the device must have it)")
    p.add_argument("--json", metavar="FILE", help="write every result to FILE")
    p.add_argument("--dry-run", action="store_true",
                   help="list the cells that would be checked; needs no GPU")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from cpmatrix.errors import ExitCode, SpecError, UsageError
    from cpmatrix.matrix.expand import expand
    from cpmatrix.matrix.load import load_matrix
    from cpmatrix.matrix.select import select_cells
    from cpmatrix.spill._loaded import crosscheck_loaded
    from cpmatrix.spill._spec import SpillError, spec_for_cell

    args = _parser().parse_args(argv)
    try:
        matrix = load_matrix(args.matrix)
        # Spill cells only: a pytest target's tests are not collected (no pytest run).
        spill = expand(matrix, collect=lambda _matrix, _target, _index: []).cells
        cells = [c for c in select_cells(spill, keyword=args.keyword) if c.kind == "spill"]
    except (SpecError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    arch, device = args.arch, ""
    if not args.dry_run:
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            print("error: TRITON_INTERPRET is set: the kernels must be compiled and loaded, "
                  "not interpreted (unset it)", file=sys.stderr)
            return ExitCode.USAGE
        found, device = _device()
        if found is None:
            print(f"error: crosscheck needs a CUDA device: {device}", file=sys.stderr)
            return ExitCode.USAGE
        if arch is not None and arch != found:
            print(f"error: --arch {arch}, but the device is {found} ({device})", file=sys.stderr)
            return ExitCode.USAGE
        arch = found
    elif arch is None:
        arch, device = _device()
    if arch is None:
        print("error: --dry-run needs --arch (there is no device to take it from)",
              file=sys.stderr)
        return ExitCode.USAGE
    search_path = list(matrix.pythonpath)
    chosen = [c for c in cells if c.spill_spec()["arch"] == arch]
    if not chosen:
        archs = sorted({c.spill_spec()["arch"] for c in cells})
        print(f"nothing selected: no spill cell for {arch} in {args.matrix} among "
              f"{len(cells)} spill cells (archs: {', '.join(archs) or 'none'})", file=sys.stderr)
        return ExitCode.NOTHING_SELECTED
    records: list[dict[str, Any]] = []
    matched = 0
    for cell in chosen:
        t0 = time.monotonic()
        try:
            spec = spec_for_cell(cell.spill_spec(), search_path)
            if args.dry_run:
                print(f"{cell.id}  {spec.kernel} {spec.constexprs} num_warps={spec.num_warps}")
                continue
            result = crosscheck_loaded(spec, search_path=search_path)
        except SpillError as exc:
            result = {"error": f"SpillError: {exc}"}
        except Exception as exc:  # a kernel that fails to load is this cell's result
            result = {"error": f"{type(exc).__name__}: {exc}"}
        ok, line = describe(cell.id, result)
        matched += ok
        print(line, flush=True)
        records.append({"cell_id": cell.id, "seconds": round(time.monotonic() - t0, 3),
                        **result})
    if args.dry_run:
        print(f"crosscheck: would check {len(chosen)} kernels for {arch}")
        return ExitCode.OK
    line = f"crosscheck: {matched}/{len(chosen)} kernels match on {device} ({arch})"
    print(line)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(
            {"summary": line, "device": device, "arch": arch, "matched": matched,
             "total": len(chosen), "cells": records}, indent=1) + "\n", encoding="utf-8")
    return ExitCode.OK if matched == len(chosen) else ExitCode.FAILURES


if __name__ == "__main__":
    sys.exit(main())
