#include "backends/emit.hpp"

#include "backends/sm80/sm80_emitter.hpp"
#include "evtc/arch.hpp"
#include "evtc/passes.hpp"

namespace evtc::backend {

backend::EmittedKernel emit_dense_kernel(const Graph& g, const GemmDesc& gemm, const KernelConfig& config) {
  // K in parts: the product's kernel (transposed or not) and the epilogue of `g` after it.
  if (config.k_parts > 1) return cutlass3::emit_parts_kernel(g, gemm, config);
  // A transposed kernel (swap-AB) is the transposed problem's kernel; the run path swaps its
  // arguments to match (runtime::BoundCall::abi).
  if (config.swap_ab) {
    const SwappedProblem swapped = swap_ab(g, gemm);
    return cutlass3::emit_kernel(swapped.graph, swapped.gemm, config);
  }
  if (backend_features(gemm.sm, gemm.a_dtype).backend == 80) return sm80::emit_kernel(g, gemm, config);
  return cutlass3::emit_kernel(g, gemm, config);
}

}  // namespace evtc::backend
