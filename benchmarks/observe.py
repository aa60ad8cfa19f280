"""The cost of the result cache's observed set (``cpmatrix.remote.observe``, docs/cache.md):
per cell in a rank, and per lookup.

    python benchmarks/observe.py [--cells 200] [--cache-dir DIR]

(1) In this process, loaded as a rank of the reference suite is (torch, torch.distributed,
DTensor, dynamo, the suite's case modules and the toolkit): the once-per-process work
(``warm``: the RECORDs and the loaded modules; the fork launcher does it before it forks),
and per cell ``start()`` + ``stop()`` around an empty cell and around a cell that reads
20 files, lists a folder and imports a module; and the audit hook's cost per event
(``sys.audit`` with the hook installed, against a process without it).

(2) With ``--cache-dir`` (a cache a run of the full matrix filled): every entry looked up
as ``cpmatrix run`` does (one ``ReadHashes`` per run, so a file shared by many entries is
hashed once), and the same again in a second "run": seconds and files hashed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_EVENTS = 200_000
_AUDIT_LOOP = (f"import sys, time\n{{hook}}\nt = time.perf_counter()\n"
               f"for _ in range({_EVENTS}): sys.audit('cpmatrix.bench')\n"
               "print(time.perf_counter() - t)\n")


def _ns_per_event(with_hook: bool) -> float:
    hook = ("from cpmatrix.remote.observe import ReadObserver\n"
            "ReadObserver(skip=())" if with_hook else "")
    proc = subprocess.run([sys.executable, "-c", _AUDIT_LOOP.format(hook=hook)],
                          capture_output=True, text=True, check=True)
    return float(proc.stdout.strip().splitlines()[-1]) / _EVENTS * 1e9


def per_cell(cells: int) -> None:
    import torch._dynamo
    import torch.distributed.tensor
    import torch.testing  # noqa: F401

    for module in ("cpmatrix.parity", "cpmatrix.suite.cases.unit", "cpmatrix.suite.cases.layer",
                   "cpmatrix.suite.cases.module", "cpmatrix.suite.cases.workflow",
                   "cpmatrix.remote.isolation", "cpmatrix.remote.subworld"):
        importlib.import_module(module)
    from cpmatrix.remote.observe import ReadObserver, warm

    t0 = time.perf_counter()
    warm()  # what importing world_main does (before the fork launcher forks)
    t_warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    obs = ReadObserver(skip=())
    t_init = time.perf_counter() - t0
    tmp = Path(tempfile.mkdtemp())
    for i in range(20):
        (tmp / f"d{i}.txt").write_text(str(i))
    (tmp / "bench_mod.py").write_text("X = 1\n")
    sys.path.insert(0, str(tmp))

    def empty() -> None:
        pass

    def busy() -> None:
        for i in range(20):
            (tmp / f"d{i}.txt").read_text()
        os.listdir(tmp)
        sys.modules.pop("bench_mod", None)
        importlib.import_module("bench_mod")

    for name, body in (("empty cell", empty), ("20 reads + 1 import", busy)):
        plain = observed = 0.0
        for _ in range(cells):
            t0 = time.perf_counter()
            body()
            plain += time.perf_counter() - t0
            t0 = time.perf_counter()
            obs.start()
            body()
            reads = obs.stop()
            observed += time.perf_counter() - t0
        extra = (observed - plain) / cells * 1000
        print(f"per cell ({name}): +{extra:.2f} ms observed ({len(reads)} paths in the set; "
              f"the cell alone {plain / cells * 1000:.2f} ms)")
    print(f"per process: warm {t_warm * 1000:.0f} ms (RECORDs, {len(sys.modules)} modules), "
          f"observer {t_init * 1000:.1f} ms")
    with_hook, without = _ns_per_event(True), _ns_per_event(False)
    print(f"audit hook: {with_hook - without:.0f} ns per event between cells "
          f"({with_hook:.0f} vs {without:.0f} ns; ratio {with_hook / without:.2f})")


def lookups(cache_dir: Path) -> None:
    from cpmatrix.run.cache import ReadHashes, ResultCache

    entries = []
    for path in sorted(cache_dir.glob("results/*/*.json")):
        data = json.loads(path.read_text())
        entries.append((data["key"], data["result"]["cell_id"], len(data["reads"])))
    if not entries:
        sys.exit(f"{cache_dir}: no entries (run the matrix with --cache-dir first)")
    for run in (1, 2):
        hashes = ReadHashes()
        cache = ResultCache(cache_dir, hashes)
        t0 = time.perf_counter()
        hits = sum(cache.get(key, cell) is not None for key, cell, _ in entries)
        took = time.perf_counter() - t0
        paths = sum(n for _, _, n in entries)
        print(f"lookup, run {run}: {hits}/{len(entries)} hits in {took:.3f} s "
              f"({paths} paths in the entries, {hashes.hashed} files hashed, "
              f"{took / len(entries) * 1000:.2f} ms per cell)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", type=int, default=200)
    ap.add_argument("--cache-dir", type=Path)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    per_cell(args.cells)
    if args.cache_dir is not None:
        lookups(args.cache_dir)


if __name__ == "__main__":
    main()
