#!/usr/bin/env bash
# One run of every GPU check and benchmark of the course (target: under 8 minutes on one H200).
#
#   autograder/gpu_check.sh             on the GPU machine (python3 there has torch 2.11 + triton 3.6);
#                                       carry .whl/ (scripts/fetch_gpu_wheels.sh) for nbgrader & co.
#   autograder/gpu_check.sh --dry-run   on a CPU machine: validates arguments, the wheel list, every
#                                       step's command line and the result files' schema (CI runs it)
#     --venv DIR                        the dry run's environment (default .venv; `make compat` builds
#                                       .venv-compat with the GPU machine's torch 2.11 + triton 3.6)
#
# Steps, each with its own time budget (a step that overruns is stopped and reported, the rest run;
# about 11 minutes at most in all, typically less; --budget-scale 0.8 tightens every budget):
#   1. doctor     versions, device, isolation
#   2. tests      every @pytest.mark.gpu test of the package
#   3. autograde  every chapter's solution notebook graded on the GPU through `ptgrade` (must be full marks)
#   4. bench      kernels vs torch, AMP speed/memory ratios, allocator replay, capstone throughput;
#                 bench_compile: the capstone compiled vs eager (whole, regional, CUDA graphs), compile seconds
#   5. allocator  record real allocator traces and check the model reproduces them step by step
#                 (once as configured by default, once with expandable_segments:True)
# Results: bench/results/gpu-check-<date>.{json,md} (+ the bench run's own files), copied to $OUT when
# set (the device tool brings $OUT back). The short table is printed last.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dry_run=0
out_dir="$root/bench/results"
budget_scale=1
venv="$root/.venv"
usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --out) out_dir=${2:?--out needs a folder}; shift ;;
    --budget-scale) budget_scale=${2:?--budget-scale needs a number}; shift ;;
    --venv) venv=${2:?--venv needs a folder}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$budget_scale" in (*[!0-9.]*|'') echo "gpu_check.sh: --budget-scale must be a number" >&2; exit 2 ;; esac

work=$(mktemp -d "${TMPDIR:-/tmp}/ptgpu.XXXXXX")
mkdir -p "$out_dir"
log() { printf '[gpu_check %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
budget() { python3 -c "print(int($1 * $budget_scale))" 2>/dev/null || echo "$1"; }

# ---- the interpreter and the packages ---------------------------------------------------------------
if [ "$dry_run" = 1 ]; then
  py="$venv/bin/python"
  [ -x "$py" ] || { echo "gpu_check.sh --dry-run needs $venv (run: make venv, or make compat-venv)" >&2; exit 3; }
  export PTINTERNALS_DEVICE=cpu
  # The wheel list must match the pinned environments exactly, or the GPU run tests other versions; and
  # the dry run says which toolchain it validated (CI's, or the GPU machine's from make compat).
  "$py" - "$root" <<'EOF' || exit 3
import re, sys
from importlib.metadata import version
from pathlib import Path
root = Path(sys.argv[1])
canonical = lambda name: re.sub(r"[-_.]+", "-", name.lower())
def pins_of(path):
    pins = {}
    for line in path.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, ver = line.split("==", 1)
            pins[canonical(name)] = ver.strip()
    return pins
files = {name: pins_of(root / name) for name in ("constraints.txt", "constraints-gpu.txt")}
bad = []
for line in (root / "autograder" / "gpu_wheels.txt").read_text().splitlines():
    if not line.strip() or line.startswith("#"):
        continue
    name, _, ver = line.partition("==")
    for file, pins in files.items():
        if not ver or pins.get(canonical(name)) != ver.strip():
            bad.append(f"{line} ({file}: {pins.get(canonical(name))})")
if bad:
    sys.exit("gpu_wheels.txt disagrees with the constraints:\n  " + "\n  ".join(bad))
print("wheel list: consistent with constraints.txt and constraints-gpu.txt")
have = {name: version(name).split("+")[0] for name in ("torch", "triton", "numpy")}
matching = [file for file, pins in files.items() if all(pins.get(n) == v for n, v in have.items())]
if not matching:
    sys.exit(f"this environment ({have}) has the pins of neither constraints.txt nor constraints-gpu.txt")
print(f"environment: torch {have['torch']}, triton {have['triton']}, numpy {have['numpy']} "
      f"(the pins of {matching[0]})")
EOF
else
  py=${PYTHON:-python3}
  if [ -d "$root/.whl" ] && ls "$root"/.whl/*.whl >/dev/null 2>&1; then
    log "installing $(ls "$root"/.whl/*.whl | wc -l) carried wheels into $work/site"
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" "$root"/.whl/*.whl \
      || { echo "gpu_check.sh: installing the carried wheels failed" >&2; exit 3; }
    export PYTHONPATH="$work/site:${PYTHONPATH:-}"
    export PATH="$work/site/bin:$PATH"
  fi
fi
export PYTHONPATH="$root/src:${PYTHONPATH:-}"
export PTINTERNALS_REPO="$root"

step() {  # step NAME SECONDS COMMAND...: run with a time limit, record status and seconds
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  log "step $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" > "$work/$name.log" 2>&1
  local rc=$?
  local t1=$(date +%s)
  printf '{"name": "%s", "rc": %d, "seconds": %d, "timed_out": %s}\n' "$name" "$rc" "$((t1 - t0))" \
    "$([ $rc = 124 ] || [ $rc = 137 ] && echo true || echo false)" > "$work/$name.step.json"
  tail -n 5 "$work/$name.log" | sed 's/^/    /'
}

# ---- 1. doctor ------------------------------------------------------------------------------------------
step doctor "$(budget 60)" "$py" -m ptinternals.grading.cli doctor

# ---- 2. GPU-marked tests ----------------------------------------------------------------------------------
if [ "$dry_run" = 1 ]; then
  step tests "$(budget 120)" "$py" -m pytest -m gpu --collect-only -q -p no:cacheprovider tests
else
  step tests "$(budget 120)" "$py" -m pytest -m gpu -q -p no:cacheprovider --junitxml="$work/tests.xml" tests
fi

# ---- 3. autograde every chapter's solution on the device, through ptgrade ---------------------------------
chapters=$("$py" -c "from ptinternals.course import SLUGS; import os; print(' '.join(s for s in SLUGS if os.path.isdir('$root/solutions/' + s)))")
[ "$dry_run" = 1 ] && chapters="strides"
course="$work/course"
mkdir -p "$course/autograder"
cp -r "$root/solutions" "$course/solutions"
cp "$root/autograder/nbgrader_config.py" "$course/autograder/"
for ch in $chapters; do
  mkdir -p "$course/autograder/submitted/reference/$ch"
  cp "$root/solutions/$ch/$ch.ipynb" "$course/autograder/submitted/reference/$ch/"
done
device=cuda
[ "$dry_run" = 1 ] && device=cpu
# The capstone's graded GPU run is capped (its loss bound loosens accordingly); the full preset run is
# measured by the benchmark below.
step autograde "$(budget 150)" env PTGRADE_ROOT="$course" PTI_CH08_GPU_ITERS="${PTI_CH08_GPU_ITERS:-500}" bash -c "
  for ch in $chapters; do
    $py -m ptinternals.grading.cli autograde \$ch --device $device --quiet || echo \"autograde \$ch failed\"
  done"
cp -r "$course/autograder/reports" "$work/reports" 2>/dev/null || true

# ---- 4. benchmarks ----------------------------------------------------------------------------------------
if [ "$dry_run" = 1 ]; then
  step bench "$(budget 120)" "$py" bench/run.py --device cpu --small --only allocator --out "$work/bench"
  step bench_compile "$(budget 60)" "$py" -c "import sys; sys.path[:0] = ['bench']; import bench_compile as b; \
print('bench_compile variants on cuda:', b._variants('cuda'))"
else
  step bench "$(budget 210)" env PTI_GPT_BENCH_ITERS="${PTI_GPT_BENCH_ITERS:-5000}" \
    "$py" bench/run.py --device cuda --full --skip compile --out "$work/bench"
  # compiled vs eager for the capstone: four compiles (whole, regional, reduce-overhead), each timed
  step bench_compile "$(budget 120)" "$py" bench/run.py --device cuda --full --only compile --tag compile \
    --out "$work/bench"
fi

# ---- 5. allocator fidelity --------------------------------------------------------------------------------
# The same with expandable segments (a fresh process: the setting must be in place before CUDA starts):
# real segment_map/segment_unmap histories, replayed by the model's expandable segments.
if [ "$dry_run" = 1 ]; then
  step allocator "$(budget 60)" "$py" -m ptinternals.allocator.recorder --help
  step allocator-expandable "$(budget 60)" "$py" -c \
    "from ptinternals.allocator import parse_alloc_conf; print(parse_alloc_conf('expandable_segments:True'))"
else
  step allocator "$(budget 45)" "$py" -m ptinternals.allocator.recorder --out "$work/allocator"
  step allocator-expandable "$(budget 45)" "$py" -m ptinternals.allocator.recorder \
    --alloc-conf expandable_segments:True --out "$work/allocator-expandable"
fi

# ---- report ----------------------------------------------------------------------------------------------
"$py" "$root/bench/gpu_report.py" --work "$work" --out "$out_dir" $([ "$dry_run" = 1 ] && echo --dry-run)
rc=$?
if [ -n "${OUT:-}" ] && [ "$dry_run" = 0 ]; then
  cp "$out_dir"/gpu-check-*.json "$out_dir"/gpu-check-*.md "$OUT"/ 2>/dev/null
  cp "$work"/bench/*.json "$OUT"/ 2>/dev/null
  tar czf "$OUT/gpu-check-logs.tgz" -C "$work" . 2>/dev/null
fi
rm -rf "$work"
exit $rc
