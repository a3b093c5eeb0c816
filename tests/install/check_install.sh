#!/usr/bin/env bash
# The C++ install is relocatable and self-contained (README, "Installing"):
#  1. `cmake --install` of the build tree writes no file that names the source or build tree;
#  2. moved to another folder, the installed `evtc` finds its device headers and the CUTLASS
#     headers installed with it (no environment variable), and compiles a kernel with them;
#  3. a consumer project builds against it with find_package(evtc) and evtc::evtc alone
#     (CUDA's headers come through the exported target) and runs;
#  4. added to another project with add_subdirectory, evtc builds no tests.
#
#   check_install.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src="$(realpath "${1:?usage: check_install.sh SOURCE_DIR BUILD_DIR}")"
build="$(realpath "${2:?usage: check_install.sh SOURCE_DIR BUILD_DIR}")"
work="$(mktemp -d "${TMPDIR:-/tmp}/evtc-install-test-XXXXXX")"
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
unset EVTC_CUTLASS_DIR CUTLASS_DIR EVTC_INCLUDE_DIR EVTC_LOG
fail() { echo "FAILED: $*"; exit 1; }

cmake --install "$build" --prefix "$work/prefix" > "$work/install.log" || { cat "$work/install.log"; fail "cmake --install"; }

# 1. No build-machine paths.
if grep -rlF -e "$src" -e "$build" "$work/prefix" > "$work/named.txt"; then
  cat "$work/named.txt"
  fail "the installed files above name the source tree $src or the build tree $build"
fi
[ -f "$work/prefix/share/doc/evtc/LICENSE" ] || fail "LICENSE is not installed"
echo "1. no installed file names $src or $build"

# 2. Relocated: headers and CUTLASS found relative to the library, a kernel compiles.
mv "$work/prefix" "$work/moved"
export EVTC_CACHE_DIR="$work/cache"
info="$("$work/moved/bin/evtc" cache info 2>&1)" || fail "evtc cache info: $info"
echo "$info" | grep -qF "evtc headers: $work/moved/include" || fail "device headers not found in the install: $info"
if [ -f "$src/.deps/cutlass/include/cutlass/cutlass.h" ] || grep -q "cutlass" "$work/install.log"; then
  echo "$info" | grep -qF "cutlass: $work/moved/share/evtc/cutlass/include (4.2." ||
    fail "the installed CUTLASS headers were not found: $info"
fi
# Nine outputs are not fused: this compiles the unfused path's plain epilogue (seconds, no CUTLASS).
many="$(for i in 0 1 2 3 4 5 6 7 8; do printf 'out o%s: bf16 = acc * %s; ' "$i" "$((i + 1))"; done)"
out="$("$work/moved/bin/evtc" compile "$many" --fallback 2>&1)" || fail "compile with the moved install: $out"
echo "$out" | grep -q "fallback epilogue: $work/cache/kernels/" || fail "no kernel compiled: $out"
echo "2. the moved install finds its headers and compiles"

# 3. A consumer project.
mkdir -p "$work/consumer"
cat > "$work/consumer/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(consumer LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(evtc REQUIRED)
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE evtc::evtc)
CMAKE
cat > "$work/consumer/main.cpp" <<'CPP'
#include <evtc/expression.hpp>
#include <evtc/log.hpp>
#include <evtc/runtime.hpp>

#include <cstdio>
#include <string>

int main() {
  const evtc::Graph g = evtc::parse_expression("out D: bf16 = silu(acc + bias[n])");
  cudaStream_t stream = nullptr;  // from cuda_runtime_api.h, through evtc::evtc
  std::printf("evtc %s: %zu output(s)%s\n", std::string(evtc::version()).c_str(), g.outputs().size(),
              stream ? "" : "");
  return g.outputs().size() == 1 ? 0 : 1;
}
CPP
cmake -S "$work/consumer" -B "$work/consumer/build" -DCMAKE_PREFIX_PATH="$work/moved" > "$work/consumer.log" 2>&1 &&
  cmake --build "$work/consumer/build" >> "$work/consumer.log" 2>&1 || { cat "$work/consumer.log"; fail "the consumer project did not build"; }
ran="$("$work/consumer/build/consumer")" || fail "the consumer did not run: $ran"
echo "$ran" | grep -q "^evtc [0-9.]*: 1 output(s)$" || fail "consumer printed: $ran"
echo "3. a consumer builds with find_package(evtc) and runs: $ran"

# 4. As a subproject: no tests.
mkdir -p "$work/parent"
cat > "$work/parent/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(parent LANGUAGES CXX)
add_subdirectory("$src" evtc)
CMAKE
cmake -S "$work/parent" -B "$work/parent/build" -G Ninja > "$work/parent.log" 2>&1 || { cat "$work/parent.log"; fail "configuring a parent project"; }
ninja -C "$work/parent/build" -t targets all > "$work/targets.txt"
if grep -q "evtc_unit_tests" "$work/targets.txt"; then fail "a subproject build has the tests"; fi
grep -q "libevtc.so" "$work/targets.txt" || fail "the subproject has no evtc library target"
echo "4. as a subproject, evtc adds no tests"
