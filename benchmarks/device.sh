#!/usr/bin/env bash
# The benchmark run for the lent GPU machine (16 host cores, one GPU), from the repo root:
#
#     bash benchmarks/device.sh
#
# Needs python3 with torch and triton (the machine's), plus pytest, pytest-benchmark, py-cpuinfo
# and pybind11 on PYTHONPATH (matplotlib too, for the plots; without it the plots are skipped).
# Builds the C++ extension in place, then runs the quick sweep twice: the CPU backends (the
# C++ port at every core, thread scaling 1..16, the oracle) and the compiled Triton backends on
# the GPU. Writes at most 8 files under $OUT (default ./device-out):
#
#     log.txt                  machine, compiler, build and pytest output
#     cpu.json  gpu.json       pytest-benchmark JSON
#     report/summary.md        tables of both runs and the issue's targets checked
#     report/*.png             speed-up over the oracle, thread scaling, GB/s against the roofline
#
# Bounded to 8.5 minutes: each step has its own timeout (build 90 s, CPU 300 s, GPU 90 s,
# report 30 s), and a step that fails does not stop the later ones. A test still running after
# 100 s prints every thread's stack (pytest's faulthandler), so a cut-off log says where it was.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT/report"
export SPECDIFF_BENCH_BUDGET="${SPECDIFF_BENCH_BUDGET:-0.6}"  # seconds per benchmark
LOG="$OUT/log.txt"
PY="${PYTHON:-python3}"
exec > >(tee -a "$LOG") 2>&1
start=$SECONDS
step() { echo; echo "=== [$((SECONDS - start)) s] $*"; }

step "machine"
lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)|L3|Flags" | cut -c1-300
free -g | head -2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
"$PY" - <<'EOF'
import importlib, sys
print("python", sys.version.split()[0])
for m in ("torch", "triton", "pytest", "pytest_benchmark", "cpuinfo", "pybind11", "matplotlib"):
    try:
        mod = importlib.import_module(m)
        print(f"{m} {getattr(mod, '__version__', '?')}")
    except Exception as e:  # noqa: BLE001
        print(f"{m} MISSING ({e})")
import torch
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
"$PY" -c "import pytest, pytest_benchmark, pybind11" || { echo "pytest, pytest-benchmark and pybind11 must be importable (PYTHONPATH)"; exit 2; }
${CXX:-g++} --version | head -1

step "build the C++ extension (in place)"
timeout 90 "$PY" setup.py build_ext --inplace -q 2>&1 | grep -vE "^copying|warning: " | tail -20
"$PY" -c "import cpu_impl._C as C; print('extension OK,', C.max_threads(), 'OpenMP threads')" || exit 3

NCORES=$(nproc)
THREADS=1
t=2
while [ "$t" -lt "$NCORES" ]; do THREADS="$THREADS,$t"; t=$((t * 2)); done
THREADS="$THREADS,$NCORES"
COMMON=(-m pytest benchmarks -p no:cacheprovider -v --benchmark-sort=fullname --benchmark-columns=min,median,rounds
        --bench-threads "$THREADS" -o faulthandler_timeout=100 --durations=10)

step "CPU: the C++ port at $NCORES threads and thread scaling ($THREADS) against the oracle"
timeout 300 "$PY" "${COMMON[@]}" -k "not triton" --benchmark-json="$OUT/cpu.json"
echo "pytest exit: $?"

step "GPU: compiled Triton against the oracle"
if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    timeout 90 "$PY" "${COMMON[@]}" -k "triton" --benchmark-json="$OUT/gpu.json"
    echo "pytest exit: $?"
else
    echo "no GPU: skipped"
fi

step "reports"
JSONS=()
for f in "$OUT/cpu.json" "$OUT/gpu.json"; do [ -f "$f" ] && JSONS+=("$f"); done
[ ${#JSONS[@]} -gt 0 ] && timeout 30 "$PY" benchmarks/report.py "${JSONS[@]}" --out "$OUT/report" --title "device machine ($NCORES host cores)"
step "done"
find "$OUT" -type f | sort
