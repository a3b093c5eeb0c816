#!/usr/bin/env bash
# Compiles the fused kernels (CUTLASS) of a few representative epilogues with nvcc, for each backend,
# through `evtc compile`, into a fresh cache: a wrong emitter fails here, on a machine
# without a GPU. Runs JOBS compiles at a time (each takes one core for a minute or two).
#
#   compile_kernels.sh EVTC_CLI [JOBS]
#
# Needs the CUTLASS headers in EVTC_CUTLASS_DIR (CTest passes the build's CUTLASS_DIR);
# exits 77 (skipped) without them. On failure, prints the compiler's errors and keeps the
# generated sources.
set -uo pipefail

cli="${1:?usage: compile_kernels.sh EVTC_CLI [JOBS]}"
jobs="${2:-2}"
if [ ! -x "$cli" ]; then
  echo "compile_kernels.sh: $cli is not an executable" >&2
  exit 2
fi
if [ -z "${EVTC_CUTLASS_DIR:-}" ] || [ ! -f "$EVTC_CUTLASS_DIR/include/cutlass/cutlass.h" ]; then
  echo "skipped: no CUTLASS headers in EVTC_CUTLASS_DIR='${EVTC_CUTLASS_DIR:-}' (configure with -DCUTLASS_DIR=...)"
  exit 77
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/evtc-nvcc-test-XXXXXX")"
# A cache path with a space: compiles run in their folder and must not split it.
export EVTC_CACHE_DIR="$work/kernel cache"
export EVTC_LOG=warning

# name | evtc compile options | expression (statements separated by ';')
fuzz_cases=()
cases=(
  # A DAG with two outputs in the transposed cooperative tiles of shapes between the selection
  # tables' M values (docs/backend.md, "Shapes outside the table", rule 6), in 4x1 clusters.
  "bias_silu_two_op_dag_swap_mid_m|--layout-b c --config coop_128x112x64_c4x1_persistent_swap|out acc_copy: bf16 = acc; out D: bf16 = silu(acc + bias[n])"
  # A DAG with an extra output and a gated one, on the ping-pong schedule, with an [m,n] operand.
  "dag_extra_output_gated_pingpong|--config pingpong_128x128x64_c2x1_persistent|f = alpha * acc + bias[n]; out pre: bf16 = f; out D: bf16 = where(f > 0, f, 0.01 * f) * gate[m,n] * gelu(f); out y: bf16 = swiglu7(f)"
  "grouped_per_group|grouped|input s: f32 ptr; out D: bf16 = silu(acc + bias[n]) * s * alpha"
  # W6's gated epilogue, on the fp8 block-scaled main loop (the bf16 one is the kernel above's).
  "grouped_fp8_blockwise_gated|grouped --dtype f8e4m3 --fp8-blockwise|input bias[n]: bf16; out y: bf16 = gptoss_swiglu(acc + bias[n])"
  # Every reduction, with the index leaves and an i32 label per row (evtc's index node, CUTLASS's
  # column broadcast of int32_t): an LM head's target logit and a one-hot mask; in f16, with a
  # scale per row, an [m,n] operand and C.
  "reductions_f16_c|--dtype f16|input C: f16; input lab[m]: i32; x = acc * s[m]; out D: f16 = relu(x) * (n != lab[m]) + m + res[m,n] + beta * C; out r = row_sum(where(n == lab[m], x, 0)); out c: f16 = col_amax(x); out t = sum(x); out lo = min(x); out l = row_logsumexp(x)"
  # Decode-sized problems' kernels: a 64-row tile of 48 columns (any multiple of 16) in a cluster
  # along N with a gated output, an [m,n] operand and output and a row reduction; split-K with a
  # 96-column tile and a gated output.
  "decode_48col_cluster_n|--layout-b c --config pingpong_64x48x128_c1x2_persistent|h = acc + bias[n]; out P: bf16 = h + r[m,n]; out y: bf16 = swiglu(h); out rs = row_sum(h)"
  "split_k_gated|--layout-b c --config coop_128x96x64_c1x1_splitk4|out D: bf16 = gelu(acc * s[m] + bias[n]); out y: bf16 = swiglu(acc)"
  # A width fitted to the grid (112 columns: one wgmma of CUTLASS's extended widths, 16-column
  # epilogue subtiles) with a gated output and a row reduction.
  "fitted_112_gated|--layout-b c --config pingpong_128x112x64_c2x1_persistent|h = acc + bias[n]; out y: bf16 = swiglu(h); out rs = row_sum(h)"
  # Swap-AB: the transposed problem's kernel, with C and D column-major, [n]/[m] vectors and the
  # row/column reductions exchanged (the row logsumexp becomes a column one), an [m,n] operand and an extra output in the other layout,
  # and m and n exchanged (an i64 [n] vector becomes a column broadcast).
  "swap_ab_decode|--layout-b c --config pingpong_64x16x128_c1x1_persistent_swap|input q[n]: i64; h = acc * s[m] + bias[n]; out D: bf16 = silu(h) + C * (m != q[n]) + n; out P: f32 = h + r[m,n]; out rs = row_sum(h); out cm = col_max(h); out ls = row_logsumexp(h)"
  # K in parts (stream-K's scheduler is the split-K case's above): a transposed batch of fp32
  # partial products and the plain epilogue after it, with the index leaves, an i64 vector, C, an
  # [m,n] operand and an extra f32 output; B row-major (GPT-2's Conv1D weight at decode sizes),
  # which the transposed kernel reads as an M-major A.
  "k_parts_swap_decode|--layout-b r --config pingpong_64x16x128_c1x1_persistent_kparts4_swap|input q[n]: i64; h = acc * s[m] + bias[n]; out D: bf16 = silu(h) + C * (m != q[n]) + n; out P: f32 = h + r[m,n]"
  "w3_fp8|--dtype f8e4m3 --layout-b c|input sa[m]: f32; input sb[n]: f32; out D: bf16 = acc * sa[m] * sb[n]"
  "w3_fp8_blockwise|--dtype f8e4m3 --layout-b c --fp8-blockwise --fallback|input bias[n]: bf16; out D: bf16 = gelu(acc + bias[n])"
  # The sm_80 backend (CUTLASS 2.x, docs/backend.md "Target architecture"): W1 and W2 in one,
  # with C, a DAG and an extra output; gated outputs and every reduction axis on sm_89's 99 KiB;
  # W7 on sm_86.
  "sm80_w1_w2_dag_c|--arch sm80 --dtype f16|input C: f16; f = acc * alpha + C + bias[n]; out D: f16 = silu(f) * gate[m,n] * (f != C); out P: f32 = f"
  "sm89_gated_reductions|--arch sm89|h = acc + bias[n]; out y: bf16 = swiglu(h); out r = row_sum(h); out c: bf16 = col_amax(h); out t = sum(h); out l = row_logsumexp(h)"
  "sm86_w7|--arch sm86 --config ms_64x128x64_s4|f = acc + bias[n]; out loss = sum((C - 1) * f + log(clamp(sigmoid(f), 1e-3, 0.999)))"
  # The compile-checked Blackwell backends: W2 (with an extra output, on the two-SM MMA), W3 with
  # W1's bias and SiLU, W7 (no D: the sink epilogue) and a gated kernel with every reduction axis
  # (two-SM MMA) for sm_100a; W3 and an fp8 gated kernel with a row reduction and W7's loss (no D) for sm_120a (its
  # kernels multiply fp8 only); W1, W7 (with W2's [m,n] operand) and a gated kernel for sm_120
  # through the sm_80 backend (16-bit GEMMs there). The indices and integer vectors ride in the
  # gated kernels of both.
  "sm100_w2_extra_output_2sm|--arch sm100 --config coop_256x128x64_c2x1_persistent|out D: bf16 = acc * gate[m,n]; out P: f32 = relu(acc) * s[m]"
  "sm100_w7|--arch sm100|f = acc + bias[n]; out loss = sum((C - 1) * f + log(clamp(sigmoid(f), 1e-3, 0.999)))"
  "sm100_gated_reductions_2sm|--arch sm100 --config coop_256x128x64_c2x1_persistent|input lab[m]: i32; h = acc + bias[n]; out y: bf16 = swiglu(h * (n != lab[m])); out r = row_sum(where(n == lab[m], h, 0)); out c: bf16 = col_amax(h); out t = sum(h); out l = row_logsumexp(h)"
  "sm100_w3_w1_fp8|--arch sm100 --dtype f8e4m3 --layout-b c|input sa[m]: f32; input sb[n]: f32; input bias[n]: bf16; out D: bf16 = silu(acc * sa[m] * sb[n] + bias[n])"
  "sm120_w3_fp8|--arch sm120 --dtype f8e4m3 --layout-b c|input sa[m]: f32; input sb[n]: f32; input bias[n]: bf16; out D: bf16 = gelu(acc * sa[m] * sb[n] + bias[n])"
  "sm120a_fp8_gated_w7|--arch sm120 --dtype f8e4m3 --layout-b c|input sa[m]: f32; input sb[n]: f32; input q[n]: i64; h = acc * sa[m] * sb[n]; out y: bf16 = swiglu(h * (m >= q[n])); out r = row_sum(h); out loss = sum((C - 1) * h + log(clamp(sigmoid(h), 1e-3, 0.999)))"
  "sm120_w1|--arch sm120|out D: bf16 = silu(acc + bias[n])"
  "sm120_w2_w7|--arch sm120|f = acc + bias[n]; out loss = sum((C - 1) * f * gate[m,n] + log(clamp(sigmoid(f), 1e-3, 0.999)))"
  "sm120_gated|--arch sm120|out y: bf16 = gptoss_swiglu(acc + bias[n])"
)

# A random epilogue of `evtc fuzz` (eight outputs), as it builds it.
while IFS= read -r line; do
  case "$line" in
    "# "*) header="$line"; body="" ;;
    *) body="${body:+$body; }$line" ;;
  esac
  if [ -n "${body:-}" ] && [ "$(printf '%s\n' "$body" | tr ';' '\n' | wc -l)" -ge 8 ] && [ "${#fuzz_cases[@]}" -lt 1 ]; then
    # The header's options without sizes and seed; a transposed case's --config kept.
    opts="$(printf '%s' "$header" | sed -E 's/^# [a-z0-9]+ -m [0-9]+ -n [0-9]+ -k [0-9]+ (.*) --seed [0-9]+( --config .*)?$/\1\2/')"
    fuzz_cases+=("fuzz_${#fuzz_cases[@]}|$opts|$body")
    body=""
  fi
done < <("$cli" fuzz --print --count 40 --min-outputs 8 --seed 7)
cases+=("${fuzz_cases[@]}")

compile_one() {
  local name="$1" options="$2" expr="$3"
  local start=$SECONDS
  # shellcheck disable=SC2086  # options is a list of words
  if [ "${options%% *}" = grouped ]; then  # a grouped (ptr-array) kernel: evtc grouped [options]
    # shellcheck disable=SC2086
    "$cli" grouped "$expr" ${options#grouped} --compile-only --emit "$work/$name.cu" >"$work/$name.log" 2>&1
  else
    "$cli" compile "$expr" $options --emit "$work/$name.cu" >"$work/$name.log" 2>&1
  fi
  local rc=$?
  echo "$rc" >"$work/$name.rc"
  echo "$name: $([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)") in $((SECONDS - start)) s"
}

start=$SECONDS
running=0
for c in "${cases[@]}"; do
  IFS='|' read -r name options expr <<<"$c"
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
  compile_one "$name" "$options" "$expr" &
  running=$((running + 1))
done
wait

failed=0
for c in "${cases[@]}"; do
  IFS='|' read -r name options expr <<<"$c"
  if [ "$(cat "$work/$name.rc" 2>/dev/null)" != 0 ]; then
    failed=1
    echo
    echo "== $name: evtc compile '$expr' $options"
    cat "$work/$name.log"
  fi
done
echo "${#cases[@]} kernels, $jobs at a time: $((SECONDS - start)) s"

# A kernel library (evtc aot build) made from one of the kernels above, with that case's
# expression and options (found in the cache, so only its plain epilogue compiles), then used
# with no nvcc: both kernels come from the library, no cache entry is made; a damaged kernel
# file is refused.
library_check() {
  local case_name="$1" name options expr c
  for c in "${cases[@]}"; do
    IFS='|' read -r name options expr <<<"$c"
    [ "$name" = "$case_name" ] && break
  done
  [ "$name" = "$case_name" ] || { echo "library check: no case named $case_name"; return 1; }
  local lib="$work/library" out rc
  # shellcheck disable=SC2086  # options is a list of words
  out="$("$cli" aot build -o "$lib" --expr "$expr" $options 2>&1)" || { echo "aot build failed: $out"; return 1; }
  echo "$out" | grep -Eq "2 kernels in $lib \(2 added, [01] compiled by nvcc" || { echo "aot build: unexpected report: $out"; return 1; }
  out="$("$cli" aot show "$lib" 2>&1)" || { echo "aot show failed: $out"; return 1; }
  echo "$out" | grep -q "usable here: yes" || { echo "aot show: $out"; return 1; }
  # shellcheck disable=SC2086
  out="$(EVTC_CACHE_DIR="$work/no-cache" CUDACXX=/nonexistent EVTC_KERNEL_LIBRARY="$lib" \
         "$cli" compile "$expr" $options --fallback 2>&1)" || { echo "no-nvcc compile failed: $out"; return 1; }
  [ "$(echo "$out" | grep -c "$lib/kernels/")" = 2 ] || { echo "no-nvcc compile did not use the library: $out"; return 1; }
  [ ! -e "$work/no-cache/kernels" ] || { echo "no-nvcc compile made cache entries"; return 1; }
  cp -r "$lib" "$work/damaged"
  local fused
  fused="$(echo "$out" | sed -n 's|^fused kernel: .*/kernels/\([0-9a-f]*\.so\).*|\1|p')"
  printf 'ZZZZ' | dd of="$work/damaged/kernels/$fused" bs=1 seek=100 count=4 conv=notrunc 2>/dev/null
  # shellcheck disable=SC2086
  out="$(env -u EVTC_LOG EVTC_CACHE_DIR="$work/no-cache" CUDACXX=/nonexistent EVTC_KERNEL_LIBRARY="$work/damaged" \
         "$cli" compile "$expr" $options 2>&1)"
  rc=$?
  if [ "$rc" = 0 ] || ! echo "$out" | grep -q "does not match its manifest entry"; then
    echo "a damaged library kernel was not refused (exit $rc): $out"
    return 1
  fi
  echo "kernel library: built from the cache, used with no nvcc, damage refused"
}
if [ "$(cat "$work/k_parts_swap_decode.rc" 2>/dev/null)" = 0 ]; then
  library_check k_parts_swap_decode || failed=1
fi

if [ "$failed" != 0 ]; then
  echo "generated sources kept in $work"
  exit 1
fi
rm -rf "$work"
