#!/usr/bin/env bash
# Benchmark suite, on a Hopper GPU machine: builds evtc and runs bench/run_suite.py, which
# measures the cold compile of one kernel, compiles every workload's tuning candidates (the
# PyTorch baselines run meanwhile), tunes each workload's shape with `evtc tune`, then times
# the tuned fused kernel against the plain cuBLAS GEMM and the unfused path in the same
# process, and writes bench/results/<stamp>.json, a PNG plot and the table in bench/README.md.
#   bash bench/run.sh [BUILD_DIR [WORKLOAD_ID ...]]   (CUTLASS_DIR=... when the headers are elsewhere)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build-bench}"
cd "$root"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEVTC_BUILD_TESTS=OFF \
  ${CUTLASS_DIR:+-DCUTLASS_DIR=$CUTLASS_DIR} > "$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" > /dev/null
shift || true
python3 bench/run_suite.py "$build/evtc" "$@"
