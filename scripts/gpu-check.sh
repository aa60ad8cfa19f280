#!/usr/bin/env bash
# gpu-check.sh: the cuda platform on a real GPU, in one script with a dated record.
#
# Run from the repository root on a host with an NVIDIA GPU (one is enough):
#
#   bash scripts/gpu-check.sh [--out DIR] [--wheels DIR] [--quick] [--export DIR]
#
# It needs nvidia-smi, python3 with torch built with CUDA (nccl), triton, pyyaml, rich and
# junitparser; it installs nothing from the network. Each missing one is printed, then it
# exits 2. cpmatrix need not be installed: it runs as `python3 -m cpmatrix` with src/ on
# PYTHONPATH, and without nox.
#
# Steps (each timed, each one's failure reported while the next ones still run):
#   1. cpmatrix run --platform cuda -k 1x1 over matrix/parity.yaml (nccl, compiled Triton
#      kernels, fp32/bf16, autocast), then every other matrix/*.yaml with 1x1 cuda cells
#      (the recipes, where they exist);
#   2. the spill gate of the device's arch (sm_90a on an H100/H200): the ptxas gate
#      (cpmatrix spill) and the loaded-kernel cross-check (python3 -m
#      cpmatrix.spill.crosscheck: Triton's n_regs/n_spills against ptxas);
#   3. timing: the kernel-path 1x1 cells compiled (cuda) vs interpreted (the cpu platform,
#      TRITON_INTERPRET=1: what the CPU CI runs for the same cells), by the cells' own
#      durations; and one 1-rank world with nccl (scripts/gpu_check/world.yaml), start to
#      report, beside the same world on gloo.
# Then the one-line summary, printed and written to OUT/summary.txt (figures in
# OUT/summary.json, environment in OUT/env.txt, everything printed in OUT/gpu-check.log).
# Exit 0 when every step passed, 1 when one failed, 2 when a prerequisite is missing.
# About 3-5 minutes on one H200 (each step has a time cap; all caps together: 8.5 min).
#
# Options:
#   --out DIR      where the reports go (default: out/gpu-check); its step folders are
#                  replaced on each run
#   --wheels DIR   a folder of wheels (or GPU_CHECK_WHEELS=DIR): when `import junitparser`
#                  fails, junitparser (and its requirements, if any) is pip-installed from
#                  DIR only (--no-index) into a temporary --target folder that goes first
#                  on PYTHONPATH. Fetch it where an index is reachable, e.g.
#                    python3 -m pip download --no-deps --only-binary=:all: -d .whl junitparser==5.0.3
#                  (.whl/ is ignored by git).
#   --quick        step 1 only for the kernel-path 1x1 cells, no recipes, no interpreted
#                  timing run (about 1-2 minutes)
#   --export DIR   also copy summary.txt, summary.json, env.txt, crosscheck.json,
#                  gpu-check.log and reports.tar.gz (every step's report.xml, results.json
#                  and logs) into DIR: at most 6 plain files, as the device tool's $OUT takes
#   --rehearse     no GPU needed: every step on the cpu platform (gloo, interpreted
#                  kernels), the crosscheck only lists its kernels; checks this script and
#                  the repo's matrices before device time is spent, measures nothing about a
#                  GPU (the summary says REHEARSAL)
#   PYTHON=...     the interpreter (default: python3)
#
# With the device tool of this workplace (the repo is copied; $OUT comes back):
#   run(command="PYTHONUNBUFFERED=1 bash scripts/gpu-check.sh --wheels .whl --export $OUT",
#       carry=[".whl"], timeout_s=600)
# See docs/gpu.md for what to record afterwards.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

OUT=out/gpu-check
WHEELS=${GPU_CHECK_WHEELS:-}
QUICK=0
REHEARSE=0
EXPORT=""
PY=${PYTHON:-python3}
while [[ $# -gt 0 ]]; do
  case $1 in
    --out|--wheels|--export)
      if [[ $# -lt 2 ]]; then echo "gpu-check: $1 needs a value" >&2; exit 2; fi
      case $1 in --out) OUT=$2 ;; --wheels) WHEELS=$2 ;; --export) EXPORT=$2 ;; esac
      shift 2 ;;
    --quick) QUICK=1; shift ;;
    --rehearse) REHEARSE=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ ! -f src/cpmatrix/__init__.py || ! -f matrix/parity.yaml ]]; then
  echo "gpu-check: run me from the repository root (no src/cpmatrix or matrix/parity.yaml here)" >&2
  exit 2
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

# ---------------------------------------------------------------- prerequisites
missing=()
if [[ $REHEARSE -eq 1 ]]; then
  :  # no GPU: the cuda-only checks below are dropped
elif ! command -v nvidia-smi >/dev/null 2>&1; then
  missing+=("nvidia-smi: not on PATH (no NVIDIA driver here)")
elif ! smi=$(nvidia-smi -L 2>&1) || ! grep -q '^GPU ' <<<"$smi"; then
  missing+=("a GPU: nvidia-smi -L lists none (${smi//$'\n'/ })")
fi
probe() {  # one line per problem, then "arch <sm_XX>" when a device answers
  "$PY" - <<'EOF'
import importlib
for name, what in (("yaml", "pyyaml"), ("rich", "rich"), ("junitparser", "junitparser")):
    try:
        importlib.import_module(name)
    except ImportError as exc:
        print(f"missing {what}: {exc}")
try:
    import torch
except ImportError as exc:
    print(f"missing torch: {exc}")
else:
    import torch.distributed as dist
    if torch.version.cuda is None:
        print(f"missing torch with CUDA: torch {torch.__version__} is a CPU-only build")
    elif not torch.cuda.is_available():
        print(f"missing a CUDA device for torch {torch.__version__} (CUDA {torch.version.cuda}):"
              " torch.cuda.is_available() is False")
    else:
        major, minor = torch.cuda.get_device_capability()
        print(f"arch sm_{major}{minor}{'a' if major * 10 + minor >= 90 else ''}")
    if not (dist.is_available() and dist.is_nccl_available()):
        print(f"missing nccl: torch {torch.__version__} has no nccl backend")
try:
    import triton
except ImportError as exc:
    print(f"missing triton: {exc}")
EOF
}
if ! command -v "$PY" >/dev/null 2>&1; then
  missing+=("$PY: not on PATH")
  found=""
else
  found=$(probe 2>&1) || true
  if grep -q '^missing junitparser' <<<"$found" && [[ -n $WHEELS ]]; then
    site=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-site.XXXXXX")
    trap 'rm -rf "$site"' EXIT
    if [[ ! -d $WHEELS ]]; then
      missing+=("junitparser: --wheels $WHEELS is not a folder")
    elif pip_log=$("$PY" -m pip install -q --no-index --find-links "$WHEELS" --target "$site" \
                   --no-compile --disable-pip-version-check junitparser 2>&1); then
      export PYTHONPATH="$site:$PYTHONPATH"
      echo "gpu-check: junitparser installed from $WHEELS into $site"
      found=$(probe 2>&1) || true
    else
      missing+=("junitparser: pip could not install it from $WHEELS: $(tail -n 1 <<<"$pip_log")")
    fi
  fi
  while IFS= read -r line; do
    case $line in
      "missing junitparser"*)
        missing+=("junitparser: not importable; pass --wheels DIR with junitparser-*.whl (see --help)") ;;
      "missing torch with CUDA"*|"missing a CUDA device"*|"missing nccl"*)
        if [[ $REHEARSE -eq 0 ]]; then missing+=("${line#missing }"); fi ;;
      missing\ *) missing+=("${line#missing }") ;;
      arch\ *|"") ;;
      *) missing+=("$PY probe: $line") ;;
    esac
  done <<<"$found"
fi
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "gpu-check: missing prerequisites (nothing was run):" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  exit 2
fi
ARCH=$(sed -n 's/^arch //p' <<<"$found")
PLATFORM=cuda
CROSSCHECK=(--json "$OUT/crosscheck.json")
if [[ $REHEARSE -eq 1 ]]; then
  PLATFORM=cpu
  ARCH=sm_90a
  CROSSCHECK=(--dry-run --arch "$ARCH")
  echo "gpu-check: REHEARSAL on the cpu platform: this checks the script, not a GPU"
fi

# ---------------------------------------------------------------- the run
STEP_DIRS=(cuda-1x1 spill-gate timing-compiled timing-interpreted world-nccl world-gloo)
mkdir -p "$OUT"
for d in "${STEP_DIRS[@]}"; do rm -rf "${OUT:?}/$d"; done
rm -rf "$OUT"/recipe-*
rm -f "$OUT"/{steps.tsv,summary.txt,summary.json,crosscheck.json,env.txt,gpu-check.log}
exec > >(tee -a "$OUT/gpu-check.log") 2>&1

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname)"
  if [[ $REHEARSE -eq 1 ]]; then
    echo "gpu: none (rehearsal on the cpu platform)"
  else
    echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | paste -sd';')"
  fi
  echo "arch: $ARCH"
  "$PY" - <<'EOF'
import sys, torch, triton
nccl = torch.cuda.nccl.version() if torch.version.cuda else None
print(f"python: {sys.version.split()[0]}\ntorch: {torch.__version__} (CUDA {torch.version.cuda}, "
      f"nccl {nccl})\ntriton: {triton.__version__}")
EOF
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "quick: $QUICK"
  echo "rehearsal: $REHEARSE"
} > "$OUT/env.txt"
cat "$OUT/env.txt"

CPM=("$PY" -m cpmatrix)
RUN=("${CPM[@]}" run --no-cache --plain)
# step NAME CAP_SECONDS CMD...: run CMD under a time cap, record "NAME exit seconds";
# a failing step never stops the script (cpmatrix exits 1 on failures).
step() {
  local name=$1 cap=$2 t0 t1 rc=0
  shift 2
  echo
  echo "==> [$name] $(printf "%q " "$@")"
  t0=$(date +%s.%N)
  timeout --signal=TERM --kill-after=30 "$cap" "$@" || rc=$?
  t1=$(date +%s.%N)
  local secs
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
  printf '%s\t%s\t%s\n' "$name" "$rc" "$secs" >> "$OUT/steps.tsv"
  if [[ $rc -eq 124 || $rc -eq 143 ]]; then
    echo "<== [$name] stopped at its ${cap} s cap (exit $rc)"
  else
    echo "<== [$name] exit $rc in $secs s"
  fi
}

# 1. the reference suite's 1x1 cells on cuda, then the recipes' 1x1 cuda cells
# (the spill cells are step 2's; on cuda there are none, on the cpu rehearsal there are)
if [[ $QUICK -eq 1 ]]; then
  step cuda-1x1 180 "${RUN[@]}" --matrix matrix/parity.yaml --platform "$PLATFORM" \
    -k "1x1 and kernel and not spill_" --out "$OUT/cuda-1x1"
else
  step cuda-1x1 180 "${RUN[@]}" --matrix matrix/parity.yaml --platform "$PLATFORM" \
    -k "1x1 and not spill_" --out "$OUT/cuda-1x1"
  for m in matrix/*.yaml; do
    case $m in matrix/parity.yaml|matrix/gates.yaml) continue ;; esac
    name=$(basename "$m" .yaml)
    rc=0
    "${CPM[@]}" list --matrix "$m" --platform "$PLATFORM" -k 1x1 >/dev/null 2>&1 || rc=$?
    if [[ $rc -eq 0 ]]; then
      step "recipe-$name" 120 "${RUN[@]}" --matrix "$m" --platform "$PLATFORM" -k 1x1 \
        --out "$OUT/recipe-$name"
    else
      echo "recipes: $m has no 1x1 $PLATFORM cell (cpmatrix list exit $rc); not run"
    fi
  done
fi

# 2. the spill gate for the device's arch: ptxas, then the kernels loaded on the device
step spill-gate 60 "${CPM[@]}" spill --matrix matrix/parity.yaml -k "arch=$ARCH" --no-cache --plain \
  --out "$OUT/spill-gate"
step crosscheck 60 "$PY" -m cpmatrix.spill.crosscheck --matrix matrix/parity.yaml \
  "${CROSSCHECK[@]}"

# 3. timing: the same kernel-path cells compiled and interpreted; one world start
if [[ $QUICK -eq 0 ]]; then
  step timing-compiled 60 "${RUN[@]}" --matrix matrix/parity.yaml --platform "$PLATFORM" \
    -k "1x1 and kernel and not spill_" --out "$OUT/timing-compiled"
  step timing-interpreted 90 "${RUN[@]}" --matrix matrix/parity.yaml --platform cpu \
    -k "1x1 and kernel and not spill_" --out "$OUT/timing-interpreted"
fi
step world-nccl 30 "${RUN[@]}" --matrix scripts/gpu_check/world.yaml --platform "$PLATFORM" \
  --out "$OUT/world-nccl"
step world-gloo 30 "${RUN[@]}" --matrix scripts/gpu_check/world.yaml --platform cpu \
  --out "$OUT/world-gloo"

# ---------------------------------------------------------------- summary
echo
rc=0
summary=("$OUT")
if [[ $REHEARSE -eq 1 ]]; then summary+=(--rehearsal); fi
"$PY" scripts/gpu_check/summarize.py "${summary[@]}" || rc=$?
if [[ -n $EXPORT ]]; then
  mkdir -p "$EXPORT"
  for f in summary.txt summary.json env.txt crosscheck.json gpu-check.log; do
    if [[ -f $OUT/$f ]]; then cp "$OUT/$f" "$EXPORT/"; fi
  done
  # Reports, results and logs of every step; not the worlds' private HOME/TMPDIR (caches).
  dirs=()
  for d in "$OUT"/*/; do dirs+=("$(basename "$d")"); done
  tar -C "$OUT" -czf "$EXPORT/reports.tar.gz" --exclude='*/home' --exclude='*/tmp' \
    --exclude='.cpmatrix.lock' steps.tsv "${dirs[@]}"
  echo "gpu-check: exported to $EXPORT"
fi
exit "$rc"
