#!/usr/bin/env bash
# Times a few kernel configurations on the workloads that miss their targets with the
# default configuration, fused vs cuBLAS in the same process (a manual precursor of the
# autotuner). Usage: bash bench/sweep_configs.sh PATH_TO_EVTC OUT_DIR
set -uo pipefail
evtc="$1"
out="$2"
mkdir -p "$out"
configs=(coop_128x256x64_c2x1_persistent coop_128x128x64_c1x1_persistent pingpong_128x128x64_c2x1_persistent coop_256x128x64_c1x2_persistent)
declare -A exprs=(
  [W1]='out D: bf16 = silu(acc + bias[n])'
  [W2]='out D: bf16 = acc * gate[m,n]'
  [W7]='f = acc + bias[n]; out loss = sum((C - 1) * f + log(clamp(sigmoid(f), 1e-3, 0.999)))'
  [W7rows]='f = acc + bias[n]; out loss = row_sum((C - 1) * f + log(clamp(sigmoid(f), 1e-3, 0.999)))'
)
# Compile everything first, in parallel.
for w in "${!exprs[@]}"; do
  for c in "${configs[@]}"; do
    "$evtc" compile "${exprs[$w]}" --config "$c" > "$out/compile-$w-$c.log" 2>&1 &
  done
done
wait
for w in W1 W2 W7 W7rows; do
  for c in "${configs[@]}"; do
    printf '%-7s %-38s ' "$w" "$c"
    "$evtc" run "${exprs[$w]}" -m 8192 -n 8192 -k 1024 --config "$c" --bench --json "$out/$w-$c.json" 2>&1 \
      | grep "fused / cuBLAS" || echo "failed: $(tail -1 "$out/compile-$w-$c.log")"
  done
done
