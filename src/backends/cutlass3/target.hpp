// What one architecture's CUTLASS 3.x/4.x kernels are built with: the parts of the generated
// translation unit that differ between sm_90a, sm_100a and sm_120a. The dense emitter
// (cutlass3/emitter.cpp) writes everything else the same way for all of them; each
// architecture's folder (sm90/, sm100/, sm120/) implements this interface and registers it for
// its backend number (TargetRegistration). A new CUTLASS 3.x backend is a folder with its Target
// and a row of the architecture table (evtc/arch.hpp, src/target/arch.cpp) naming that number.
#pragma once
#include <string>

#include "evtc/gemm.hpp"
#include "evtc/kernel_config.hpp"

namespace evtc::cutlass3 {

class Target {
 public:
  virtual ~Target() = default;
  // The #include lines of the CUTLASS headers the kernel needs (after the banner).
  virtual std::string cutlass_includes(const GemmDesc& gemm, const KernelConfig& c) const = 0;
  // The prefix of CUTLASS's aux load/store descriptors ("" for Sm90AuxLoadDescriptor).
  virtual std::string aux_descriptor_prefix() const { return ""; }
  // Where the collective epilogue has no void-D form: the evtc device header whose sink stores
  // a D-less kernel's unused D, and its wrapper of the built collective. Empty: void D.
  virtual std::string d_sink_header() const { return ""; }
  virtual std::string d_sink_epilogue() const { return ""; }
  // Whether the collective epilogue assigns the tree's result to D's fragment without a
  // conversion (the root must then convert to ElementD).
  virtual bool root_converts_to_d() const { return false; }
  // Whether configuration `c` runs one MMA on two SMs (each CTA's TileShape holds half the rows).
  virtual bool two_sm(const KernelConfig&) const { return false; }
  // Whether the builders take the MMA's tile (MmaTileShape) instead of the CTA's.
  virtual bool separate_mma_tile() const { return false; }
  // cutlass::gemm::<KernelSchedule> and cutlass::epilogue::<EpilogueSchedule>.
  virtual std::string kernel_schedule(const KernelConfig& c, bool two_sm, bool blockwise, bool fast_accum) const;
  virtual std::string epilogue_schedule(const KernelConfig& c, bool two_sm) const;
  // The `using EpilogueDescriptor = ...;` declaration (and a blank line) for C's and D's types.
  virtual std::string epilogue_descriptor(const std::string& elem_c, const std::string& elem_d) const;
  // A constant expression of the epilogue's warps (one reduction partial each).
  virtual std::string epilogue_warps() const;
};

// The Target of a CUTLASS 3.x backend (ArchFeatures::backend: 90, 100, 120): the one registered
// for that number.
const Target& target_for(int backend);

// Registers `target` for `backend` when the library loads: each architecture's folder defines
// one, `const TargetRegistration registered{90, target};` at namespace scope. A second
// registration of a number fails at load time.
struct TargetRegistration {
  TargetRegistration(int backend, const Target& target);
};

}  // namespace evtc::cutlass3
