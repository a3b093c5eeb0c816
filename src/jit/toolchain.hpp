// Where the tools and headers a kernel compile needs are, and their versions.
#pragma once
#include <string>
#include <vector>

namespace evtc::jit {

struct Toolchain {
  std::string nvcc;              // path of nvcc
  std::string nvcc_version;      // "13.0.88"
  std::string cutlass_include;   // folder holding cutlass/cutlass.h
  std::string cutlass_version;   // "4.2.0"
  std::string evtc_include;      // folder holding evtc/device/ops.cuh
};

// Finds nvcc (CUDACXX, CUDA_HOME/bin, PATH, the toolkit evtc was built with), the CUTLASS
// headers (EVTC_CUTLASS_DIR, CUTLASS_DIR, the folder set at build time) and evtc's device
// headers (EVTC_INCLUDE_DIR, the source tree, the install prefix). Throws RuntimeError
// saying what to install or set. `need_cutlass` false skips CUTLASS (fallback kernels).
const Toolchain& toolchain(bool need_cutlass = true);

// The nvcc flags every fused kernel is compiled with (without -I and -o).
std::vector<std::string> kernel_flags(int sm, bool need_cutlass);

}  // namespace evtc::jit
