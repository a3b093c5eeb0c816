// sm_90a (Hopper): CUTLASS 3.x TMA warp-specialized kernels with wgmma, cooperative or
// ping-pong, fp8 with two-level accumulation, fast accumulation or block scales.
#include "backends/cutlass3/target.hpp"
#include "backends/sm90/wgmma_shapes.hpp"

namespace evtc::cutlass3 {

namespace {

class Sm90 final : public Target {
 public:
  // Only the sm90 parts of CUTLASS: the umbrella headers (gemm/collective/collective_builder.hpp,
  // gemm/kernel/gemm_universal.hpp, the GemmUniversalAdapter that includes it) pull in every
  // architecture's builders, main loops and kernels, which nvcc then parses for nothing. The
  // host code calls the kernel's static functions directly instead of the adapter.
  std::string cutlass_includes(const GemmDesc& gemm, const KernelConfig& c) const override {
    std::string s = sm90::extended_wgmma_widths_define(c.tile_n);
    s += R"(
#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>
#include <cutlass/device_kernel.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/collective/collective_mma_decl.hpp>
#include <cutlass/gemm/collective/collective_builder_decl.hpp>
#include <cutlass/gemm/collective/builders/sm90_gmma_builder.inl>
#include <cutlass/gemm/collective/sm90_mma_tma_gmma_ss_warpspecialized.hpp>
)";
    if (gemm.fp8_blockwise)  // the main loop that scales each 128-wide K block's partial product
      s += "#include <cutlass/detail/blockwise_scale_layout.hpp>\n"
           "#include <cutlass/gemm/collective/fp8_accumulation.hpp>\n"
           "#include <cutlass/gemm/collective/sm90_mma_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp>\n";
    else if (is_fp8(gemm.a_dtype) || is_fp8(gemm.b_dtype))  // two-level accumulation's main loop
      s += "#include <cutlass/gemm/collective/sm90_mma_tma_gmma_ss_warpspecialized_fp8.hpp>\n";
    s += R"(#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/kernel/gemm_universal_decl.h>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>
)";
    s += c.schedule == MainloopSchedule::cooperative
             ? "#include <cutlass/gemm/kernel/sm90_gemm_tma_warpspecialized_cooperative.hpp>\n"
             : "#include <cutlass/gemm/kernel/sm90_gemm_tma_warpspecialized_pingpong.hpp>\n";
    return s;
  }
};

const Sm90 target;
const TargetRegistration registered{90, target};

}  // namespace

}  // namespace evtc::cutlass3
