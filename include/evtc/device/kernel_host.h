// Host code every generated dense kernel library shares, whichever backend built its kernel:
// loading the kernel from the cubin the library holds, and the scratch of the fused
// reductions' partial results. Included once per library (internal linkage: each library has
// its own copy and its own loaded kernel).
#ifndef EVTC_DEVICE_KERNEL_HOST_H
#define EVTC_DEVICE_KERNEL_HOST_H

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "evtc/device/abi.h"

namespace evtc::device {
namespace {

// The cubin `image` (a library compiled in two parts: the kernel's cubin is linked into the host
// part), loaded on first use into every device's context; kernel_from_image: its kernel `name`.
cudaLibrary_t library_from_image(const unsigned char* image, cudaError_t* error) {
  static cudaLibrary_t library = nullptr;
  static cudaError_t status = cudaSuccess;
  static std::once_flag once;
  std::call_once(once, [&] { status = cudaLibraryLoadData(&library, image, nullptr, nullptr, 0, nullptr, nullptr, 0); });
  *error = status;
  return status == cudaSuccess ? library : nullptr;
}

// Which: one cached handle per kernel of the library (0: the GEMM, 1: a second kernel).
template <int Which = 0>
const void* kernel_from_image(const unsigned char* image, const char* name, cudaError_t* error) {
  static cudaKernel_t kernel = nullptr;
  static cudaError_t status = cudaSuccess;
  static std::once_flag once;
  std::call_once(once, [&] {
    cudaLibrary_t library = library_from_image(image, &status);
    if (status == cudaSuccess) status = cudaLibraryGetKernel(&kernel, library, name);
  });
  *error = status;
  return status == cudaSuccess ? reinterpret_cast<const void*>(kernel) : nullptr;
}

// Scratch for the fused reductions' partial results, after the GEMM's own workspace: one
// region per reduction in slot order, each a multiple of 256 bytes. `axes` names each
// reduction's axis: 'a' (whole matrix: one partial per warp and tile), 'r' (over N: tiles_n
// rows of the padded M, one value per row of each tile), 'c' (over M: tiles_m rows of the
// padded N). The kernels after the GEMM (reduce.cuh) fold them in a fixed order.
template <int TileM, int TileN, int Warps>
struct ReductionScratch {
  const char* axes;
  int count;

  static int64_t tiles_m(const evtc_gemm_args& a) { return (a.m + TileM - 1) / TileM; }
  static int64_t tiles_n(const evtc_gemm_args& a) { return (a.n + TileN - 1) / TileN; }
  static size_t floats(const evtc_gemm_args& a, char axis) {
    if (axis == 'a') return size_t(tiles_m(a) * tiles_n(a) * Warps);
    if (axis == 'R') return size_t(tiles_m(a) * tiles_n(a)) * TileM * 2;  // (m, s) pairs
    return size_t(tiles_m(a) * tiles_n(a)) * (axis == 'r' ? TileM : TileN);
  }
  static size_t bytes(const evtc_gemm_args& a, char axis) { return (floats(a, axis) * sizeof(float) + 255) / 256 * 256; }
  size_t total_bytes(const evtc_gemm_args& a) const {
    size_t total = 0;
    for (int i = 0; i < count; ++i) total += bytes(a, axes[i]);
    return total;
  }
  // Reduction `index`'s partials; null while only sizing or checking (no scratch yet).
  float* partials(const evtc_gemm_args& a, char* scratch, int index) const {
    if (!scratch) return nullptr;
    size_t offset = 0;
    for (int i = 0; i < index; ++i) offset += bytes(a, axes[i]);
    return reinterpret_cast<float*>(scratch + offset);
  }
};

}  // namespace
}  // namespace evtc::device

#endif  // EVTC_DEVICE_KERNEL_HOST_H
