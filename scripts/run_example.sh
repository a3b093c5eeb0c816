#!/usr/bin/env bash
# The main job (`make run`): explain an example epilogue, then, with a GPU, run it fused on
# a 4096³ problem, check it against the fp64 reference and time it against cuBLAS; without
# a GPU, generate its CUDA kernel and compile it with nvcc (no run).
set -euo pipefail
build="${1:-build}"
example="${2:-examples/w1_bias_silu.evt}"
evtc="$build/evtc"
echo "== evtc explain $example"
"$evtc" explain "$example"
echo
echo "== evtc explain --passes $example"
"$evtc" explain --passes "$example"
echo
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "== evtc run $example -m 4096 -n 4096 -k 4096 --check --bench"
  "$evtc" run "$example" -m 4096 -n 4096 -k 4096 --check --bench
else
  echo "== no GPU here: evtc compile $example (generates and compiles the fused kernel)"
  "$evtc" compile "$example" --fallback
fi
