"""Where a world start's time goes, for each launcher: a breakdown and the ratio.

    python benchmarks/world_start.py [--ranks 4 9] [--reps 2] [--smoke]

Starts a gloo world (init_process_group, a 2-D DeviceMesh, one small DTensor round trip)
through ``torch.distributed.run`` and through cpmatrix's fork launcher
(:mod:`cpmatrix.worker.forkrun`), alternately in one run, and prints, per phase, when the
slowest rank reached it (seconds since the launch; median over ``--reps``):

- ``launcher``: until the rank's code runs (torchrun: interpreter + agent + rendezvous;
  fork: the parent's imports + fork);
- ``torch import``, ``cpmatrix import``: the rank's own imports (fork: already done);
- ``process group``: ``init_process_group`` (store rendezvous + gloo connections);
- ``mesh``: ``init_device_mesh`` (one ``new_group`` per row and column);
- ``first op``: a DTensor distribute + full_tensor;
- ``exit``: until the launcher exited.

``--smoke``: one 2-rank start per launcher. The ranks run ``benchmarks/_world_start_rank.py``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench import HERE, add_smoke

PHASES = ("entered", "torch_imported", "cpmatrix_imported", "process_group", "mesh",
          "first_dtensor_op")
NAMES = ("launcher", "torch import", "cpmatrix import", "process group", "mesh", "first op")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(launcher: str, ranks: int, out: Path) -> dict[str, float]:
    """One world start; the phase times of the slowest rank, split into increments."""
    out.mkdir(parents=True)
    module = "cpmatrix.worker.forkrun" if launcher == "fork" else "torch.distributed.run"
    extra = [] if launcher == "fork" else ["--nnodes=1", "--max-restarts=0",
                                           "--monitor-interval=0.1"]
    argv = [sys.executable, "-m", module, *extra, f"--nproc-per-node={ranks}",
            "--master-addr=127.0.0.1", f"--master-port={free_port()}",
            "-m", "_world_start_rank", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    t0 = time.time()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    t_exit = time.time()
    stamps = [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]
    reached = [max(s[p] for s in stamps) - t0 for p in PHASES] + [t_exit - t0]
    steps = [reached[0]] + [b - a for a, b in itertools.pairwise(reached)]
    return dict(zip((*NAMES, "exit"), steps, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[4, 9])
    ap.add_argument("--reps", type=int, default=2)
    add_smoke(ap)
    args = ap.parse_args()
    if args.smoke:
        args.ranks, args.reps = [2], 1
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in args.ranks:
            runs: dict[str, list[dict[str, float]]] = {"torchrun": [], "fork": []}
            for rep in range(args.reps):
                for launcher in runs:  # alternate: the machine's load hits both alike
                    out = Path(tmp, f"{ranks}-{launcher}-{rep}")
                    runs[launcher].append(start(launcher, ranks, out))
            print(f"\n{ranks}-rank gloo world start (median of {args.reps}, seconds):")
            print(f"{'phase':18}{'torchrun':>10}{'fork':>10}")
            totals = {}
            for phase in (*NAMES, "exit"):
                row = {k: statistics.median(r[phase] for r in v) for k, v in runs.items()}
                print(f"{phase:18}{row['torchrun']:10.2f}{row['fork']:10.2f}")
            for k, v in runs.items():
                totals[k] = statistics.median(sum(r.values()) for r in v)
            print(f"{'total':18}{totals['torchrun']:10.2f}{totals['fork']:10.2f}"
                  f"   fork is {totals['torchrun'] / totals['fork']:.1f}x faster")


if __name__ == "__main__":
    main()
