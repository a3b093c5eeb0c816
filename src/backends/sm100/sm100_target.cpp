// sm_100a (Blackwell B200/GB200): CUTLASS 4.2's tcgen05 (UMMA) kernels, one SM per MMA or two
// for 256-row tiles, their accumulators in tensor memory (fp8 accumulates at full precision,
// no promotion). The epilogue is a warp group of its own that reads tensor memory, with its
// own descriptors; the collective epilogue has no void-D form and stores the tree's result as
// it is.
#include <fmt/format.h>

#include "backends/cutlass3/target.hpp"
#include "backends/cutlass3/umbrella_includes.hpp"

namespace evtc::cutlass3 {

namespace {

class Sm100 final : public Target {
 public:
  std::string cutlass_includes(const GemmDesc&, const KernelConfig&) const override { return kUmbrellaIncludes; }
  std::string aux_descriptor_prefix() const override { return "Sm100"; }
  std::string d_sink_header() const override { return "evtc/device/sm100_epilogue.cuh"; }
  std::string d_sink_epilogue() const override { return "evtc::device::Sm100EpilogueWithoutD"; }
  bool root_converts_to_d() const override { return true; }
  bool two_sm(const KernelConfig& c) const override { return c.tile_m == 256; }
  bool separate_mma_tile() const override { return true; }
  std::string kernel_schedule(const KernelConfig&, bool two_sm, bool, bool) const override {
    return fmt::format("KernelTmaWarpSpecialized{}SmSm100", two_sm ? 2 : 1);
  }
  std::string epilogue_schedule(const KernelConfig&, bool two_sm) const override {
    return two_sm ? "TmaWarpSpecialized2Sm" : "TmaWarpSpecialized1Sm";
  }
  std::string epilogue_descriptor(const std::string& elem_c, const std::string& elem_d) const override {
    return fmt::format(
        "using EpilogueDescriptor = cutlass::epilogue::collective::detail::Sm100EpilogueDescriptor<\n"
        "    cutlass::arch::OpClassTensorOp, MmaTileShape, EpilogueTile, float, {}, {}, EpilogueSchedule,\n"
        "    cutlass::detail::TagToStrideC_t<cutlass::layout::RowMajor>, "
        "cutlass::detail::TagToStrideC_t<cutlass::layout::RowMajor>, false, false>;\n\n",
        elem_c, elem_d);
  }
  std::string epilogue_warps() const override { return "CollectiveEpilogue::ThreadCount / 32"; }
};

const Sm100 target;
const TargetRegistration registered{100, target};

}  // namespace

}  // namespace evtc::cutlass3
