// The CUTLASS 3.x backends, and what they share by default: the sm90-style warp-specialized
// schedules, epilogue descriptor and epilogue warps (the MMA's warp groups).
#include <fmt/format.h>

#include <map>

#include "backends/cutlass3/target.hpp"
#include "evtc/error.hpp"

namespace evtc::cutlass3 {

std::string Target::kernel_schedule(const KernelConfig& c, bool, bool blockwise, bool fast_accum) const {
  return fmt::format("{}{}",
                     c.schedule == MainloopSchedule::cooperative ? "KernelTmaWarpSpecializedCooperative"
                                                                 : "KernelTmaWarpSpecializedPingpong",
                     blockwise ? "FP8Blockwise" : fast_accum ? "FP8FastAccum" : "");
}

std::string Target::epilogue_schedule(const KernelConfig& c, bool) const {
  return c.schedule == MainloopSchedule::cooperative ? "TmaWarpSpecializedCooperative" : "TmaWarpSpecialized";
}

std::string Target::epilogue_descriptor(const std::string& elem_c, const std::string& elem_d) const {
  return fmt::format(
      "using EpilogueDescriptor = cutlass::epilogue::collective::detail::EpilogueDescriptor<\n"
      "    TileShape, EpilogueTile, {}, {}, EpilogueSchedule>;\n\n",
      elem_c, elem_d);
}

std::string Target::epilogue_warps() const {
  return "decltype(cute::size(typename CollectiveMainloop::TiledMma{}))::value / 32";
}

namespace {

// Function-local, so that registrations in other files (initialized in any order) find it built.
std::map<int, const Target*>& registry() {
  static std::map<int, const Target*> targets;
  return targets;
}

}  // namespace

TargetRegistration::TargetRegistration(int backend, const Target& target) {
  if (!registry().emplace(backend, &target).second)
    internal_fail(__FILE__, __LINE__, fmt::format("two CUTLASS 3.x targets registered for backend {}", backend));
}

const Target& target_for(int backend) {
  if (auto it = registry().find(backend); it != registry().end()) return *it->second;
  internal_fail(__FILE__, __LINE__, fmt::format("no CUTLASS 3.x target registered for backend {}", backend));
}

}  // namespace evtc::cutlass3
