// Host-side cost of launching: how long a call takes on the CPU before it returns (the GPU
// work is queued, not waited for). Used by `evtc run --bench` and the benchmark suite.
#pragma once
#include <cuda_runtime_api.h>

#include "evtc/runtime.hpp"

namespace evtc::runtime {

struct DispatchTimes {
  double run_us = 0;      // Kernel::run: validation, plan lookup, the library's evtc_run
  double library_us = 0;  // the compiled library's evtc_run alone, same arguments every call
                          // (its launch cache hits: the launch only)
  double library_new_args_us = 0;  // evtc_run with arguments that change every call (a
                                   // workspace pointer out of 5 in turn, more than its cache
                                   // holds): CUTLASS's set-up, TMA descriptors, then the launch
  double cublas_us = 0;   // a cuBLASLt matmul of the same problem, for scale
};

// Medians over 200 calls each, after warm-up. `kernel` must take the fused path for `args`
// and have its library loaded (one run() before).
DispatchTimes measure_dispatch(const Kernel& kernel, const Arguments& args, cudaStream_t stream);

// The GPU time (ms, runtime::median_ms) of cuBLASLt's GEMM of the problem `args` holds, A and B
// as `kernel` binds them, into a scratch D of `d_dtype`: the library GEMM a fused kernel is
// compared with (`evtc run --bench`).
double cublas_gemm_ms(const Kernel& kernel, const Arguments& args, DType d_dtype, cudaStream_t stream);

}  // namespace evtc::runtime
