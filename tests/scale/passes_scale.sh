#!/usr/bin/env bash
# The parser and the pass pipeline scale linearly with the size of an epilogue: 100,000 outputs
# go through `evtc explain --passes` (every pass, the graph printed after each) in a few
# seconds. Building a graph was quadratic in its named nodes before (an 8,000-output epilogue
# took 2.9 s, 100,000 several minutes); CTest's timeout on this test catches a return of that.
#   passes_scale.sh EVTC_CLI
set -euo pipefail
cli="${1:?usage: passes_scale.sh EVTC_CLI}"
work="$(mktemp -d "${TMPDIR:-/tmp}/evtc-scale-XXXXXX")"
trap 'rm -rf "$work"' EXIT
awk 'BEGIN { for (i = 0; i < 100000; i++) printf "out o%d: bf16 = acc * %d + r[n]\n", i, i + 1 }' > "$work/wide.evt"
start=$SECONDS
"$cli" explain --passes "$work/wide.evt" > "$work/out.txt"
# Every output survives the pipeline, and it is refused for fusion by the output limit.
grep -q "o99999" "$work/out.txt"
grep -q "at most 8 can be fused" "$work/out.txt"
echo "100,000 outputs through the passes in $((SECONDS - start)) s"
