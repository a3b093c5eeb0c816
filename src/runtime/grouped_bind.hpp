// Binding a grouped (MoE) GEMM call: its x, weights, offsets, block scales, output and
// epilogue operands checked against the kernel (shapes, dtypes, strides, alignment), each
// error naming what is wrong, and gathered into what both paths run from (GroupedKernel::run:
// the fused kernel's C ABI arguments, or one dense call per group).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "evtc/device/grouped_abi.h"
#include "evtc/grouped.hpp"
#include "evtc/kernel_config.hpp"

namespace evtc::runtime {

struct GroupedCall {
  TensorRef x;
  BatchedTensorRef w;
  const int32_t* offsets = nullptr;  // the groups' end offsets (device)
  int64_t groups = 0, total_m = 0, n = 0, k = 0;
  bool k_major = true;  // each group's weights N×K, K-major
  // fp8 block scales (GemmDesc::fp8_blockwise), and their K and N block counts.
  std::optional<TensorRef> scale_a;
  std::optional<BatchedTensorRef> scale_b;
  int64_t k_blocks = 0, n_blocks = 0;
  TensorRef y;           // the output
  int64_t out_cols = 0;  // N, or N/2 for a gated output
  // The signature's pointer operands in its order, each with its step between groups in
  // elements (0: one for every group); the by-value scalars.
  std::vector<void*> ptrs;
  std::vector<int64_t> group_strides;
  std::vector<double> scalars;
  // Device pointers still to be checked (after every cheaper check), with what they are.
  std::vector<std::pair<const void*, std::string>> device_ptrs;

  // The fused kernel's arguments; they point into this object's tables.
  evtc_grouped_args abi() const;
};

// Why a grouped problem with N output columns and K cannot run, on either path (empty when it
// can): a gated output needs even N; x and the weights 16-byte rows; the output 16-byte rows.
std::string grouped_shape_problem(bool gated, const std::string& output, int64_t n, int64_t k, DType x_dtype);

// Checks a call against the kernel's signature and GEMM; a UserError names the first operand
// that is wrong. `output` is the kernel's one output (`gated`: [m,n/2]), of `output_dtype`.
GroupedCall bind_grouped(const KernelSignature& sig, const GemmDesc& gemm, bool gated, const std::string& output,
                         DType output_dtype, const GroupedArguments& args);

}  // namespace evtc::runtime
