// Conversion of stacked [W_gate; W_up] weights into the interleaved layout of gated kernels
// (include/evtc/gated.hpp).
#include <fmt/format.h>

#include <cstring>

#include "evtc/error.hpp"
#include "evtc/gated.hpp"

namespace evtc {
namespace {

void check_args(const void* stacked, const void* interleaved, int64_t inter, int64_t k,
                DType dtype) {
  if (inter <= 0 || k <= 0)
    throw UserError(fmt::format("interleave_gate_up: inter={} and k={} must be positive", inter, k));
  if (!stacked) throw UserError("interleave_gate_up: the stacked weights are a null pointer");
  if (!interleaved) throw UserError("interleave_gate_up: the output is a null pointer");
  const auto bytes = 2 * inter * k * dtype_bytes(dtype);
  const auto* s = static_cast<const char*>(stacked);
  const auto* d = static_cast<const char*>(interleaved);
  if (s < d + bytes && d < s + bytes)
    throw UserError("interleave_gate_up: the stacked weights and the output overlap; convert "
                    "into a separate buffer");
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw RuntimeError(fmt::format("interleave_gate_up: {}: {}", what, cudaGetErrorString(e)));
  }
}

}  // namespace

void interleave_gate_up(const void* stacked, void* interleaved, int64_t inter, int64_t k,
                        DType dtype, Layout layout, cudaStream_t stream) {
  check_args(stacked, interleaved, inter, k, dtype);
  const size_t e = static_cast<size_t>(dtype_bytes(dtype));
  const auto* src = static_cast<const char*>(stacked);
  auto* dst = static_cast<char*>(interleaved);
  if (layout == Layout::col_major) {
    // Rows of K elements: gate row j -> row 2j, up row j -> row 2j+1. Two pitched copies.
    const size_t row = static_cast<size_t>(k) * e;
    for (int half = 0; half < 2; ++half)
      check(cudaMemcpy2DAsync(dst + half * row, 2 * row, src + half * inter * row, row, row,
                              static_cast<size_t>(inter), cudaMemcpyDeviceToDevice, stream),
            half == 0 ? "copying the gate rows" : "copying the up rows");
    return;
  }
  // K rows of 2I elements: element (r, j) of a half goes to column 2j (+1 for up). One 3-D
  // copy per half: x = the element's bytes, y = its column j, z = the row r.
  for (int half = 0; half < 2; ++half) {
    cudaMemcpy3DParms p{};
    p.srcPtr = cudaPitchedPtr{const_cast<char*>(src) + half * inter * e, e, e,
                              static_cast<size_t>(2 * inter)};
    p.dstPtr = cudaPitchedPtr{dst + half * e, 2 * e, e, static_cast<size_t>(inter)};
    p.extent = cudaExtent{e, static_cast<size_t>(inter), static_cast<size_t>(k)};
    p.kind = cudaMemcpyDeviceToDevice;
    check(cudaMemcpy3DAsync(&p, stream), half == 0 ? "copying the gate columns" : "copying the up columns");
  }
}

void interleave_gate_up_host(const void* stacked, void* interleaved, int64_t inter, int64_t k,
                             DType dtype, Layout layout) {
  check_args(stacked, interleaved, inter, k, dtype);
  const size_t e = static_cast<size_t>(dtype_bytes(dtype));
  const auto* src = static_cast<const char*>(stacked);
  auto* dst = static_cast<char*>(interleaved);
  if (layout == Layout::col_major) {
    const size_t row = static_cast<size_t>(k) * e;
    for (int64_t j = 0; j < inter; ++j) {
      std::memcpy(dst + (2 * j) * row, src + j * row, row);
      std::memcpy(dst + (2 * j + 1) * row, src + (inter + j) * row, row);
    }
    return;
  }
  for (int64_t r = 0; r < k; ++r) {
    const char* in = src + r * 2 * inter * e;
    char* out = dst + r * 2 * inter * e;
    for (int64_t j = 0; j < inter; ++j) {
      std::memcpy(out + (2 * j) * e, in + j * e, e);
      std::memcpy(out + (2 * j + 1) * e, in + (inter + j) * e, e);
    }
  }
}

std::optional<std::vector<int64_t>> interleaved_strides(std::span<const int64_t> sizes,
                                                        std::span<const int64_t> gate_strides,
                                                        int64_t gate_offset,
                                                        std::span<const int64_t> up_strides,
                                                        int64_t up_offset, int64_t dim) {
  const auto rank = static_cast<int64_t>(sizes.size());
  if (rank == 0 || gate_strides.size() != sizes.size() || up_strides.size() != sizes.size()) return std::nullopt;
  if (dim < 0) dim += rank;
  if (dim < 0 || dim >= rank) return std::nullopt;
  for (int64_t i = 0; i < rank; ++i) {
    if (sizes[i] <= 0) return std::nullopt;
    if (sizes[i] > 1 && gate_strides[i] != up_strides[i]) return std::nullopt;
  }
  const int64_t step = up_offset - gate_offset;  // the merged stride along `dim`
  if (step <= 0) return std::nullopt;
  if (sizes[dim] > 1 && gate_strides[dim] != 2 * step) return std::nullopt;
  std::vector<int64_t> strides(gate_strides.begin(), gate_strides.end());
  strides[dim] = step;
  if (sizes.back() > 1 && strides.back() != 1) return std::nullopt;
  return strides;
}

}  // namespace evtc
