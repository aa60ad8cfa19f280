"""The cost of the result cache's observed set (``cpmatrix.worker.observe``, docs/cache.md):
per cell in a rank, and per lookup.

    python benchmarks/observe.py [--cells 200] [--cache-dir DIR --matrix FILE] [--smoke]

(1) In this process, loaded as a rank of the reference suite is (torch, torch.distributed,
DTensor, dynamo, the suite's case modules and the toolkit): the once-per-process work
(``warm``: the RECORDs and the loaded modules; the fork launcher does it before it forks),
and per cell ``start()`` + ``stop()`` around an empty cell and around a cell that reads
20 files, lists a folder and imports a module; and the audit hook's cost per event
(``sys.audit`` with the hook installed, against a process without it).

(2) With ``--cache-dir`` (a cache a run of ``--matrix``, default the reference suite,
filled): ``cpmatrix run`` of that matrix twice more against the cache, each looking every
cell up (one ``ReadHashes`` per run, so a file shared by many entries is hashed once): the
lookup's seconds and files hashed as the run reports them, and the run's wall time.

``--smoke``: 3 cells in (1); for (2), without ``--cache-dir``, a cache that one cell of
``benchmarks/batching.yaml`` fills.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from _bench import HERE, ROOT, add_smoke, cpmatrix

_EVENTS = 200_000
_AUDIT_LOOP = (f"import sys, time\n{{hook}}\nt = time.perf_counter()\n"
               f"for _ in range({_EVENTS}): sys.audit('cpmatrix.bench')\n"
               "print(time.perf_counter() - t)\n")


def _ns_per_event(with_hook: bool) -> float:
    hook = ("from cpmatrix.worker.observe import ReadObserver\n"
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
                   "cpmatrix.worker.isolation", "cpmatrix.worker.subworld"):
        importlib.import_module(module)
    from cpmatrix.worker.observe import ReadObserver, warm

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


#: The run's line about its lookup (cli output): "cache: 3 of 4 cells cached (looked up in
#: 0.01 s, 26 files hashed)".
_LOOKUP = re.compile(r"^cache: (\d+) of (\d+) cells cached.*\(looked up in ([\d.]+) s, "
                     r"(\d+) files hashed\)", re.M)


def lookups(cache_dir: Path, matrix: Path, runs: int = 2) -> None:
    """The run's cache lookup over ``matrix``, ``runs`` times (the first may find the
    files cold)."""
    for run in range(1, runs + 1):
        with tempfile.TemporaryDirectory() as out:
            wall, proc = cpmatrix("run", "--matrix", str(matrix), "--cache-dir", str(cache_dir),
                                  "--out", out, "--plain", cwd=ROOT, codes=(0, 1))
        found = _LOOKUP.search(proc.stdout)
        if found is None:
            sys.exit(f"no lookup line in cpmatrix run's output:\n{proc.stdout[-3000:]}")
        hits, cells, took, hashed = found.groups()
        if int(hits) == 0:
            sys.exit(f"{cache_dir}: no hit for {matrix} (fill it with cpmatrix run "
                     "--cache-dir first)")
        print(f"lookup, run {run}: {hits}/{cells} hits in {took} s ({hashed} files hashed, "
              f"{float(took) / int(cells) * 1000:.2f} ms per cell); the run {wall:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", type=int, default=200)
    ap.add_argument("--cache-dir", type=Path)
    ap.add_argument("--matrix", type=Path, default=ROOT / "matrix" / "parity.yaml",
                    help="the matrix whose run filled --cache-dir")
    add_smoke(ap)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    per_cell(3 if args.smoke else args.cells)
    if args.cache_dir is not None:
        lookups(args.cache_dir, args.matrix)
    elif args.smoke:
        with tempfile.TemporaryDirectory() as tmp:
            matrix = Path(tmp, "one.yaml")  # one cell of the batching matrix
            shutil.copytree(HERE / "cases", Path(tmp, "cases"))
            spec = yaml.safe_load((HERE / "batching.yaml").read_text())
            target, = spec["targets"]
            target["axes"]["mesh"], target["params"]["rep"] = ["2x2"], [0]
            matrix.write_text(yaml.safe_dump(spec))
            cpmatrix("run", "--matrix", str(matrix), "--cache-dir", f"{tmp}/cache",
                     "--out", f"{tmp}/out", "--plain")
            lookups(Path(tmp, "cache"), matrix, runs=1)


if __name__ == "__main__":
    main()
