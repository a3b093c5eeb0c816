#pragma once
// The runtime's one check of a CUDA runtime call's result.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "evtc/error.hpp"

namespace evtc::runtime {

// Throws RuntimeError("<what>: <CUDA's message>") unless `e` is cudaSuccess.
inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw RuntimeError(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}

}  // namespace evtc::runtime
