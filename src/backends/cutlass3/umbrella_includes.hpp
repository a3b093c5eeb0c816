// CUTLASS's umbrella headers, for the compile-checked backends (not trimmed to one
// architecture's parts as sm_90a's are).
#pragma once

namespace evtc::cutlass3 {

inline constexpr const char* kUmbrellaIncludes = R"(
#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>
#include <cutlass/device_kernel.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
)";

}  // namespace evtc::cutlass3
