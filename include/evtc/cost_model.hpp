// The cost model front ends decide fusion with: for one problem on the current GPU, what the
// fused kernel is expected to take against cuBLAS plus the separate epilogue kernel that
// fusion removes. The PyTorch FX pass fuses a chain only when the estimate says it pays
// (docs/backend.md, "Cost model", has the rates and how they were measured).
#pragma once
#include <cstdint>
#include <string>

namespace evtc {

struct FusionEstimate {
  int64_t m = 0, n = 0, k = 0;
  double cublas_us = 0;    // the GEMM alone as the unfused path runs it: cuBLAS, or torch._grouped_mm for a grouped GEMM
  double epilogue_us = 0;  // the unfused epilogue kernel(s) fusion removes (0: there are none;
                           // negative: fusion writes more than it removes)
  double fused_us = 0;     // evtc's fused kernel
  double saved_bytes = 0;  // device-memory traffic fusion removes
  std::string config;      // the kernel configuration the fused kernel runs with
  std::string basis;       // where fused_us comes from: "model", or "table <file> at MxNxK"
  // fused_us and cublas_us rest on the shipped selection table's measurement of evtc's kernel
  // and cuBLAS's GEMM where it holds here: this shape's entry, or a nearby one whose
  // configuration runs here unchanged on as many tiles across M, with the same N and K or among
  // neighbours that all measured evtc ahead (selection::measured_here). A GEMM with nothing to
  // fuse leaves cuBLAS only on such an estimate.
  bool measured = false;

  // Fused is faster than cuBLAS + the epilogue by more than the model's margin (3 %, and at
  // least 0.5 us): a fusion that does not pay is not made.
  bool profitable() const;
  // "12.1 us fused vs 11.0 + 3.2 us unfused (model, coop_...)"; "... vs 11.0 - 3.2 us unfused"
  // and why where epilogue_us is negative.
  std::string describe() const;
};

// The work an unfused path does that fusion removes, as the front end sees it: the bytes of
// intermediate results written and read back, and the kernels launched for them.
struct UnfusedWork {
  double saved_bytes = 0;
  int kernels = 0;  // epilogue kernels
  // GEMMs the unfused path runs side by side over N, each N/gemms wide: a merged gate/up chain
  // replaces one GEMM per source, each with its own launch and its own tile grid.
  int gemms = 1;
};

}  // namespace evtc
