#!/usr/bin/env bash
# The benchmark run for a GPU machine (16 host cores, one GPU), from the repo root:
#
#     bash benchmarks/device.sh
#
# Needs python3 with torch and triton (the machine's), plus pytest, pytest-benchmark, py-cpuinfo
# and pybind11 on PYTHONPATH (matplotlib too, for the plots; without it the plots are skipped).
# Builds the C++ extension in place, then runs the steps STEPS names (default "cpu gpu"):
#
#     cpu         the quick sweep of the CPU backends (the C++ port at every core, thread scaling
#                 1..16, the oracle)                                                     300 s
#     gpu         the quick sweep of the compiled Triton backends against the oracle    90 s
#     engine      the C++ port beside vLLM's CPU port (benchmarks/test_bench_engine.py: every
#                 kernel at 1, 64, 256 requests, 1 and all threads; needs SPECDIFF_VLLM)  330 s
#     gpu-engine  our compiled Triton beside vLLM's (benchmarks/gpu_engine.py; SPECDIFF_VLLM)  300 s
#
# One call of the device holds 10 minutes, so the engine comparison is a second call:
#
#     bash benchmarks/device.sh
#     STEPS="engine gpu-engine" SPECDIFF_VLLM=$PWD/.cache/vllm-min bash benchmarks/device.sh
#
# Writes under $OUT (default reports/device): log.txt (machine, compiler, build and pytest output),
# cpu.json, gpu.json, engine.json (pytest-benchmark JSON), report/summary.md (the tables and the
# targets checked, the engine's side by side), report/gpu-engine.md and .json, plots.
# Each step has its own timeout (build 90 s, report 30 s), and a step that fails does not stop the
# later ones. A test still running after 100 s prints every thread's stack (pytest's faulthandler),
# so a cut-off log says where it was.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/reports/device}"
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

STEPS="${STEPS:-cpu gpu}"
want() { [[ " $STEPS " == *" $1 "* ]]; }
has_gpu() { "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; }

if want cpu; then
    step "CPU: the C++ port at $NCORES threads and thread scaling ($THREADS) against the oracle"
    timeout 300 "$PY" "${COMMON[@]}" -k "not triton" --ignore=benchmarks/test_bench_engine.py --benchmark-json="$OUT/cpu.json"
    echo "pytest exit: $?"
fi

if want gpu; then
    step "GPU: compiled Triton against the oracle"
    if has_gpu; then
        timeout 90 "$PY" "${COMMON[@]}" -k "triton" --ignore=benchmarks/test_bench_engine.py --benchmark-json="$OUT/gpu.json"
        echo "pytest exit: $?"
    else
        echo "no GPU: skipped"
    fi
fi

if want engine; then
    step "engine: the C++ port beside vLLM's CPU port (SPECDIFF_VLLM=${SPECDIFF_VLLM:-unset})"
    SPECDIFF_BENCH_BUDGET=0.3 timeout 330 "$PY" -m pytest benchmarks/test_bench_engine.py -p no:cacheprovider -q \
        -o faulthandler_timeout=100 --benchmark-json="$OUT/engine.json"
    echo "pytest exit: $?"
fi

if want gpu-engine; then
    step "GPU: our compiled Triton beside vLLM's (SPECDIFF_VLLM=${SPECDIFF_VLLM:-unset})"
    if has_gpu; then
        timeout 300 "$PY" benchmarks/gpu_engine.py --out "$OUT/report"
        echo "gpu_engine exit: $? (2: a target missed, 1: a wrong output)"
    else
        echo "no GPU: skipped"
    fi
fi

step "reports"
JSONS=()
for f in "$OUT/cpu.json" "$OUT/gpu.json" "$OUT/engine.json"; do [ -f "$f" ] && JSONS+=("$f"); done
[ ${#JSONS[@]} -gt 0 ] && timeout 30 "$PY" benchmarks/report.py "${JSONS[@]}" --out "$OUT/report" --title "device machine ($NCORES host cores)"
step "done"
find "$OUT" -type f | sort
