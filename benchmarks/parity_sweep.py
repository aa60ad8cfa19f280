"""The parity verdict over many seeds: correct cells that fail, planted bugs caught, margins.

Runs ``cpmatrix run --mutants`` over the twin-judged (fp32/bf16) cells of the reference
suite (``matrix/parity.yaml``, the ``*_lowp`` targets), the recipes (``matrix/recipes.yaml``,
their fp32 cells) and the flip cases (``tests/resources/parity/flips.yaml``: a ReLU MLP and
a top-k MoE, 10% bugs on 1-, 3-, 8- and 16-element bias grads), each target once per seed
(a ``rep`` parameter: the cell id, and so its seed, differs per rep). Reports:

- correct-cell failures (must be 0) and planted-bug catch rates, per source;
- the minimum margin of a correct cell (budget / |cp - twin| of its closest tensor);
- per tiny bias (1, 3, 8, 16 elements) and compute precision: the bug size guaranteed to
  fail (the largest budget / scale seen over the seeds, from the 10% bugs' failures).

    python benchmarks/parity_sweep.py --seeds 20        # the full sweep (niced; ~1 h on 2 cores)
    python benchmarks/parity_sweep.py --smoke           # one seed of a few flip cells
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml
from _bench import ROOT, add_smoke, cpmatrix

from cpmatrix.report import read_report

#: ``name: max abs A, max rel R, B/N outside; |cp - twin| E vs budget G`` in a failure.
_LINE = re.compile(r"(\S+): max abs \S+, max rel \S+, \d+/(\d+) outside; "
                   r"\|cp - twin\| (\S+) vs budget (\S+)")
#: ``name: |cp - twin| E of budget G`` (``parity.twin_worst`` of a passing cell).
_WORST = re.compile(r"\|cp - twin\| (\S+) of budget (\S+)")
#: ``name: a change under P% of its largest value (S) passes`` (``parity.resolution``).
_RESOLUTION = re.compile(r"(\S+): a change under (\S+)% of its largest value")
_BIASES = ("fc2.bias", "head.bias")


def _excludes(names: set[str], *paths: Path) -> list[Any]:
    """The entries of the files' top-level ``exclude`` blocks (cells each file leaves out,
    with why) that name one of the targets ``names``, cut to those."""
    out: list[Any] = []
    for path in paths:
        for entry in yaml.safe_load(path.read_text(encoding="utf-8")).get("exclude", []):
            named = entry.get("target", [])
            named = [named] if isinstance(named, str) else named
            if set(named) & names:
                out.append({**entry, "target": [n for n in named if n in names]})
    return out


def _targets(path: Path, keep: Any, dtypes: list[str], seeds: int) -> list[dict[str, Any]]:
    """The targets of ``path`` that ``keep(target)`` selects, their dtypes cut to
    ``dtypes``, each with ``rep: [1..seeds]`` added."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    defaults = doc.get("defaults", {})
    out = []
    for target in doc["targets"]:
        if not keep(target) or "cpu" not in target.get("platforms", ["cpu"]):
            continue
        axes = dict(target.get("axes", {}))
        wanted = [d for d in axes.get("dtype", defaults.get("dtype", ["fp64"])) if d in dtypes]
        if not wanted:
            continue
        axes["dtype"] = wanted
        if "mesh" in axes:  # the meshes: a 6- or 9-rank world is minutes to start here
            meshes = [m for m in axes["mesh"] if m in MESHES]
            if not meshes:
                continue
            axes["mesh"] = meshes
        params = dict(target.get("params", {}))
        params["rep"] = list(range(1, seeds + 1))
        kept = {k: v for k, v in target.items() if k not in ("platforms", "exclude")}
        out.append({**kept, "axes": axes, "params": params})
    return out


SOURCES = ("suite", "recipes", "flips")
#: Meshes swept (1x2, 2x1, 2x2): 2 and 4 ranks, one world each.
MESHES = ("1x2", "2x1", "2x2")


def _matrix(seeds: int, smoke: bool, sources: tuple[str, ...] = SOURCES) -> dict[str, Any]:
    flips = ROOT / "tests" / "resources" / "parity"
    if smoke:
        cases = _targets(flips / "flips.yaml", lambda t: t["name"] == "relu_mlp", ["fp32"],
                         seeds)
        for t in cases:
            t["axes"] = {**t["axes"], "mesh": ["1x2"], "autocast": ["off"]}
            t["params"] = {**t["params"], "d_out": [1]}
        return {"version": 1, "pythonpath": [str(flips)],
                "platforms": {"cpu": {"backend": "gloo", "device": "cpu"}}, "targets": cases}
    suite = _targets(ROOT / "matrix" / "parity.yaml", lambda t: t["name"].endswith("_lowp"),
                     ["fp32", "bf16"], seeds) if "suite" in sources else []
    for t in suite:  # the kernel path runs Triton's interpreter: minutes per cell on CPU
        t["axes"] = {**t["axes"], "path": ["reference"]}
    recipes = _targets(ROOT / "matrix" / "recipes.yaml", lambda t: True, ["fp32", "bf16"],
                       seeds) if "recipes" in sources else []
    cases = (_targets(flips / "flips.yaml", lambda t: True, ["fp32", "bf16"], seeds)
             if "flips" in sources else [])
    return {"version": 1, "pythonpath": [str(flips)],
            "platforms": {"cpu": {"backend": "gloo", "device": "cpu",
                                  "env": {"TRITON_INTERPRET": "1"}}},
            "targets": [*suite, *recipes, *cases],
            "exclude": _excludes({t["name"] for t in [*suite, *recipes]},
                                 ROOT / "matrix" / "parity.yaml", ROOT / "matrix" / "recipes.yaml")}


def _source(target: str) -> str:
    if target.startswith(("relu_mlp", "moe_topk")):
        return "flip cases"
    return "suite" if target.endswith("_lowp") else "recipes"


def _precision(props: Any) -> str:
    dtype, autocast = props.get("dtype", "?"), props.get("autocast", "off")
    return f"{dtype}+autocast" if autocast == "on" else dtype


def _pct(x: float) -> str:
    return f"{100 * x:.2g}%"


def summarize(out: Path) -> str:
    """The tables of one run's ``report.xml`` (Markdown)."""
    cells = read_report(out / "report.xml")
    plain: dict[str, list[int]] = defaultdict(lambda: [0, 0])   # source -> [cells, failed]
    caught: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # source -> [judged, killed]
    margins: dict[str, list[float]] = defaultdict(list)
    tiny: dict[tuple[int, str], list[float]] = defaultdict(list)  # (numel, prec) -> b/scale
    # (numel, prec) -> budget / scale of the last bias in each correct cell (resolution)
    resolution: dict[tuple[int, str], list[float]] = defaultdict(list)
    undecidable: dict[str, int] = defaultdict(int)  # source -> survivors below resolution
    failed_ids = []
    for c in cells:
        props = c.properties
        source = _source(props.get("target", c.cell_id))
        if not c.mutant:
            plain[source][0] += 1
            if c.status.value != "passed":
                plain[source][1] += 1
                failed_ids.append(f"{c.cell_id}: {c.headline[:160]}")
            for key, value in props.items():  # every check_parity label of the cell
                m = _WORST.search(value) if key.endswith(".twin_worst") else None
                if m and float(m.group(1)) > 0:
                    margins[source].append(float(m.group(2)) / float(m.group(1)))
                for name, pct in (_RESOLUTION.findall(value) if key.endswith(".resolution")
                                  else []):
                    if name.endswith(_BIASES):
                        d_out = re.search(r"d_out=(\d+)", props.get("params", ""))
                        numel = int(d_out.group(1)) if d_out else 0
                        resolution[(numel, _precision(props))].append(float(pct) / 100)
            continue
        if c.status.value == "not_judged":
            continue
        if c.status.value == "survived" and any(
                "BELOW RESOLUTION" in v for k, v in props.items() if k.endswith(".resolution")):
            undecidable[source] += 1
        caught[source][0] += 1
        caught[source][1] += c.status.value == "killed"
        if c.mutant == "bias_grad_10pct" and c.status.value == "killed":
            for name, numel, err, budget in _LINE.findall(c.text):
                if name.endswith(("fc2.bias", "head.bias")) and float(err) > 0:
                    tiny[(int(numel), _precision(props))].append(
                        0.1 * float(budget) / float(err))
                    break
        elif c.mutant == "bias_grad_10pct":
            tiny[(0, _precision(props))].append(float("inf"))
    lines = ["| source | correct cells | failed | planted bugs judged | killed | survived below "
             "resolution | min margin | median margin |", "|---|---|---|---|---|---|---|---|"]
    for source in sorted(plain):
        cells_n, failed = plain[source]
        judged, killed = caught[source]
        ms = margins[source]
        lines.append(f"| {source} | {cells_n} | {failed} | {judged} | {killed} "
                     f"| {undecidable[source]} | {min(ms, default=0):.2f} | "
                     f"{statistics.median(ms) if ms else 0:.2f} |")
    lines += ["", "| bias elements | precision | seeds killed | bug size guaranteed to fail "
              "(max budget / scale) | median |", "|---|---|---|---|---|"]
    for (numel, prec), sizes in sorted(tiny.items()):
        finite = [s for s in sizes if s != float("inf")]
        lines.append(f"| {numel or 'survived'} | {prec} | {len(finite) if numel else len(sizes)} "
                     f"| {_pct(max(finite, default=0))} "
                     f"| {_pct(statistics.median(finite) if finite else 0)} |")
    if resolution:
        lines += ["", "| bias elements | precision | correct cells | budget / scale: max | 95th "
                  "pct | median | cells below 10% resolution |", "|---|---|---|---|---|---|---|"]
    for (numel, prec), fracs in sorted(resolution.items()):
        ordered = sorted(fracs)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        lines.append(f"| {numel} | {prec} | {len(fracs)} | {_pct(ordered[-1])} | {_pct(p95)} "
                     f"| {_pct(statistics.median(fracs))} | {sum(f > 0.1 for f in fracs)} |")
    if failed_ids:
        lines += ["", "correct cells that failed:", *failed_ids]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20, help="runs per target (default 20)")
    parser.add_argument("--out", type=Path, default=None, help="where the run writes")
    parser.add_argument("--summarize", type=Path, default=None,
                        help="only print the tables of a finished run's --out folder")
    parser.add_argument("--sources", default=",".join(SOURCES),
                        help=f"comma-separated, of {', '.join(SOURCES)} (default: all)")
    add_smoke(parser)
    args = parser.parse_args()
    sources = tuple(x for x in args.sources.split(",") if x)
    if not set(sources) <= set(SOURCES):
        parser.error(f"--sources: unknown {sorted(set(sources) - set(SOURCES))} "
                     f"(allowed: {', '.join(SOURCES)})")
    if args.summarize:
        print(summarize(args.summarize))
        return 0
    seeds = 1 if args.smoke else args.seeds
    work = Path(tempfile.mkdtemp(prefix="parity-sweep-"))
    out = args.out or work / "out"
    matrix = work / "sweep.yaml"
    matrix.write_text(yaml.safe_dump(_matrix(seeds, args.smoke, sources), sort_keys=False),
                      encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    wall, _ = cpmatrix("run", "--matrix", str(matrix), "--mutants", "--out", str(out),
                          "--plain", "--platform", "cpu", env=env, codes=(0, 1))
    print(f"{seeds} seed(s), {wall:.0f} s wall, load {os.getloadavg()[0]:.1f}; out: {out}")
    print(summarize(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
