#!/usr/bin/env bash
# compute-sanitizer's memcheck, racecheck and synccheck over one kernel of each kind evtc runs,
# on a GPU machine. Each run also checks every output against the fp64 reference at sizes that
# are not tile multiples, so a kernel that writes the wrong place fails twice.
#
#   bash scripts/sanitize-gpu.sh [PATH_TO_EVTC]      (default: build/evtc; `make sanitize-gpu`)
#
# Kernels: a dense epilogue with [n], [m] and [m,n] operands and two outputs; a gated
# (SwiGLU) epilogue; row and column reductions; split-K and stream-K; a transposed (swap-AB)
# decode kernel; fp8 with row-wise scales; block-scaled fp8; a grouped (MoE) kernel with an
# empty group; and the unfused path (an f32 GEMM, which evtc runs with cuBLASLt and an
# epilogue kernel). Every kernel is compiled (in parallel) and checked once without the
# sanitizer first. Logs go to $SANITIZE_LOGS (default build/sanitize-logs); the script exits
# non-zero if any run reports an error or a mismatch.
set -uo pipefail
cli=${1:-build/evtc}
logs=${SANITIZE_LOGS:-build/sanitize-logs}
[ -x "$cli" ] || { echo "sanitize-gpu: no evtc command at '$cli' (build it first: make build)" >&2; exit 2; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$cs" ] || { echo "sanitize-gpu: compute-sanitizer not found (on PATH or in /usr/local/cuda/bin)" >&2; exit 2; }
mkdir -p "$logs"

dense='input bias[n]: bf16
input s[m]: f32
input r[m,n]: bf16
out D: bf16 = silu(acc + bias[n]) * s[m] + r[m,n]
out P: bf16 = acc'
reductions='input bias[n]: bf16
out D = acc + bias[n]
out r: f32 = row_sum(acc)
out c: f32 = col_max(acc)'
fp8='input sa[m]: f32
input sb[n]: f32
out D: bf16 = gelu(acc * sa[m] * sb[n])'

names=() cmds=()
add() { names+=("$1"); shift; cmds+=("$(printf '%q ' "$@")"); }
add dense      "$cli" run "$dense" -m 300 -n 520 -k 264 --layout-b c --check
add gated      "$cli" run 'out D = swiglu(acc)' -m 300 -n 528 -k 264 --layout-b c --check
add reductions "$cli" run "$reductions" -m 300 -n 520 -k 264 --layout-b c --check
add split_k    "$cli" run "$dense" -m 40 -n 520 -k 1032 --layout-b c --config coop_128x64x64_c1x1_splitk2 --check
add stream_k   "$cli" run 'out D = gelu(acc)' -m 300 -n 520 -k 1032 --layout-b c --config coop_128x128x64_c1x1_streamk --check
add swap_ab    "$cli" run "$dense" -m 40 -n 520 -k 264 --layout-b c --config pingpong_64x32x128_c1x1_persistent_swap --check
add fp8_rows   "$cli" run "$fp8" -m 300 -n 520 -k 384 --dtype f8e4m3 --layout-b c --check
add fp8_blocks "$cli" run 'out D: bf16 = acc' -m 300 -n 512 -k 384 --dtype f8e4m3 --layout-b c --fp8-blockwise --check
add grouped    "$cli" grouped 'out D = silu(acc)' -g 4 --rows 100,0,37,260 -n 264 -k 200 --check
add unfused    "$cli" run 'out D: f32 = silu(acc) * 2' -m 300 -n 520 -k 264 --dtype f32 --check

# A run passed its check when it reported at least one PASS and no FAIL.
checked() { grep -q "^check.*: PASS" "$1" && ! grep -q "^check.*FAIL" "$1"; }

failed=0
echo "compiling and checking ${#names[@]} kernels"
for i in "${!names[@]}"; do
  ( eval "${cmds[$i]}" > "$logs/plain-${names[$i]}.log" 2>&1 ) &
done
wait
for i in "${!names[@]}"; do
  if ! checked "$logs/plain-${names[$i]}.log"; then
    echo "FAIL ${names[$i]} (without the sanitizer): see $logs/plain-${names[$i]}.log"; failed=1
  fi
done
for tool in memcheck racecheck synccheck; do
  for i in "${!names[@]}"; do
    log="$logs/$tool-${names[$i]}.log"
    eval "$cs --tool $tool --error-exitcode 99 --print-limit 20 ${cmds[$i]}" > "$log" 2>&1
    rc=$?
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tr '\n' ' ')
    if [ $rc -ne 0 ] || ! checked "$log"; then
      echo "FAIL $tool ${names[$i]} (exit $rc): $summary see $log"; failed=1
    else
      echo "ok   $tool ${names[$i]}: $summary"
    fi
  done
done
[ $failed -eq 0 ] && echo "sanitize-gpu: $(( ${#names[@]} * 3 )) runs, 0 errors" || echo "sanitize-gpu: FAILED"
exit $failed
