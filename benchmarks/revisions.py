"""One ``cpmatrix run`` under two revisions of cpmatrix, interleaved: the same cells, the
same verdicts, and the wall-clock ratio, for a change meant to leave behaviour alone.

    python benchmarks/revisions.py --base REV [--rounds 2] [--full] [--smoke]

``REV`` (a commit, a tag, ``HEAD~3``) is exported with ``git archive`` into a scratch
folder and run from there (``PYTHONPATH`` to its ``src``, the same interpreter and
installed packages); the other side is this checkout's working tree. Each side runs its
own tree's matrix file and cases (a change to them shows as a moved verdict). The cells: the peer
benchmark's 30 (``benchmarks/batching.yaml``, 15 on 2x2 and 15 on 3x3), or with ``--full``
the CPU matrix of ``matrix/parity.yaml``; both sides ``--no-cache``, each into a fresh
``--out``. The rounds alternate which side goes first (base head, head base, ...), the
1-minute load is printed before each run, and the script exits 1 when any cell ends
differently between the two sides (a refactor that moved a verdict is not a speed
question).

Machines are noisy: compare the ratio of the medians, measured in one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from _bench import HERE, ROOT, add_smoke, cpmatrix, report


def export(rev: str, into: Path) -> Path:
    """``rev``'s tree, exported into ``into``; the folder its ``src`` is in."""
    archive = into / "base.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive),
                    rev], check=True, capture_output=True)
    with tarfile.open(archive) as tar:
        # The "data" filter (Python 3.11.4+) refuses links out of the tree; a git archive
        # of this repository holds none, so older interpreters extract it plainly.
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(into / "base", **safe)  # type: ignore[arg-type]
    return into / "base"


def one_run(tree: Path, out: Path, args: list[str]) -> tuple[float, dict[str, str]]:
    """Wall seconds and each cell's status of ``cpmatrix run ARGS`` from ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    wall, _ = cpmatrix("run", *args, "--out", str(out), "--plain", "--no-cache",
                       cwd=tree, env=env, codes=(0, 1))
    return wall, {c.cell_id: c.status.value for c in report(out)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="HEAD", help="the revision to compare with (default "
                    "HEAD: the working tree against its last commit)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each side (default 2)")
    ap.add_argument("--full", action="store_true", help="the CPU matrix of "
                    "matrix/parity.yaml instead of the peer benchmark's 30 cells")
    add_smoke(ap)
    args = ap.parse_args()
    if args.full and not args.smoke:
        cells = ["--matrix", "matrix/parity.yaml", "--platform", "cpu"]
    else:
        select = "rep=0] and 2x2" if args.smoke else "rep="
        cells = ["--matrix", str((HERE / "batching.yaml").relative_to(ROOT)), "-k", select]
    rounds = 1 if args.smoke else args.rounds
    walls: dict[str, list[float]] = {"base": [], "head": []}
    verdicts: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"base": export(args.base, Path(tmp)), "head": ROOT}
        for r in range(rounds):
            for side in ("base", "head") if r % 2 == 0 else ("head", "base"):
                load = os.getloadavg()[0]
                wall, statuses = one_run(trees[side], Path(tmp, f"{side}-{r}"), cells)
                walls[side].append(wall)
                print(f"round {r + 1} {side:4} {wall:7.1f} s  {len(statuses)} cells  "
                      f"(load {load:.1f})", flush=True)
                if verdicts.setdefault(side, statuses) != statuses:
                    sys.exit(f"{side}: round {r + 1} ended cells differently from round 1")
    moved = sorted(c for c in verdicts["base"].keys() | verdicts["head"].keys()
                   if verdicts["base"].get(c) != verdicts["head"].get(c))
    base, head = statistics.median(walls["base"]), statistics.median(walls["head"])
    print(f"base {args.base}: median {base:.1f} s; head (this tree): median {head:.1f} s; "
          f"head/base {head / base:.2f}")
    if moved:
        for cell in moved:
            print(f"  {cell}: base {verdicts['base'].get(cell)}, "
                  f"head {verdicts['head'].get(cell)}")
        sys.exit(f"{len(moved)} cells ended differently under the two revisions")
    print(f"same verdicts: {len(verdicts['head'])} cells")


if __name__ == "__main__":
    main()
