// sm_120a (GeForce/RTX Blackwell): fp8 kernels with the sm90-style warp-specialized schedules
// of CUTLASS's own sm_120 builder; its collective epilogue stores the tree's result as it is.
// (16-bit GEMMs on sm_120 take the sm_80 backend.)
#include "backends/cutlass3/target.hpp"
#include "backends/cutlass3/umbrella_includes.hpp"

namespace evtc::cutlass3 {

namespace {

class Sm120 final : public Target {
 public:
  std::string cutlass_includes(const GemmDesc&, const KernelConfig&) const override { return kUmbrellaIncludes; }
  bool root_converts_to_d() const override { return true; }
};

const Sm120 target;
const TargetRegistration registered{120, target};

}  // namespace

}  // namespace evtc::cutlass3
