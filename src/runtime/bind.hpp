// Binding one call's Arguments to a kernel's signature: validates every operand (device,
// dtype, shape, strides) and fills the C ABI's flat tables. Reasons the call cannot take the
// fused path (a layout other than the one compiled, unaligned data) are collected rather
// than thrown: such a call runs the fallback.
#pragma once
#include <array>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "evtc/device/abi.h"
#include "evtc/runtime.hpp"

namespace evtc::runtime {

// Device pointers already checked with cudaPointerGetAttributes, so that a caller reusing
// its buffers pays for the query once rather than per operand per call. A pointer is
// remembered with the device it lives on; a pointer seen on another current device is
// checked again. Thread-safe.
class PointerChecks {
 public:
  // Throws UserError (named by `what()`) unless p is device memory of the current device.
  template <typename What>
  void check(const void* p, const What& what) {
    if (!p) fail_null(what());
    int device = 0;
    cudaGetDevice(&device);
    if (known(p, device)) return;
    query(p, device, what());
  }

 private:
  bool known(const void* p, int device);
  void query(const void* p, int device, const std::string& what);
  [[noreturn]] static void fail_null(const std::string& what);

  std::mutex mu_;
  std::array<std::pair<const void*, int>, 32> seen_{};
  size_t next_ = 0;
};

struct BoundCall {
  int64_t m = 0, n = 0, k = 0;
  Layout a_layout = Layout::row_major, b_layout = Layout::row_major;
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;
  void* d = nullptr;
  int64_t lda = 0, ldb = 0, ldc = 0, ldd = 0;
  // fp8 block scales (GemmDesc::fp8_blockwise); null otherwise.
  const void* scale_a = nullptr;
  const void* scale_b = nullptr;
  int64_t ld_scale_a = 0;  // between K blocks of scale_a
  int64_t scale_a_m_stride = 1, scale_b_k_stride = 0, scale_b_n_stride = 1;
  std::vector<void*> ptrs;      // in signature order
  std::vector<double> scalars;  // in signature order
  // Why this call cannot take the fused path; empty if it can.
  std::vector<std::string> reasons;

  // The ABI arguments; they point into this object's tables. `swap_ab`: a transposed kernel's
  // (KernelConfig::swap_ab), which computes Dᵀ = Bᵀ·Aᵀ: A and B, M and N and their leading
  // dimensions exchanged. C, D and the operand tables stay: the kernel reads the same memory
  // in the other layout. `order`: the tile scheduler's visiting order (of the kernel's own
  // problem, the transposed one for a transposed kernel).
  evtc_gemm_args abi(bool swap_ab = false, const VisitOrder& order = {}) const;
};

// The fp8 block-scale checks a dense and a grouped call share, with one wording: scales given
// to a kernel built without them (`kernel`: "kernel", "grouped kernel"), and a scale tensor
// that is not f32. Each throws UserError naming the tensor.
void refuse_unexpected_block_scales(bool scale_a, bool scale_b, const char* kernel);
void require_f32_block_scales(const char* name, DType dtype);

BoundCall bind_arguments(const KernelSignature& sig, const GemmDesc& gemm, const Arguments& args,
                         PointerChecks& pointers);

}  // namespace evtc::runtime
