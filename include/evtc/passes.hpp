// The epilogue pass pipeline (src/passes/pipeline.cpp lists the passes in order).
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "evtc/gemm.hpp"
#include "evtc/graph.hpp"

namespace evtc {

// How casts are placed (see docs/passes.md):
//  eager: round where PyTorch eager would materialise a lower-precision tensor, so fused
//         results follow eager's rounding;
//  fast:  compute in f32 throughout and round once at each store.
enum class CastMode { eager, fast };

// An operand bound as an M×N view: its logical shape and element strides.
// A dimension of size 1 or stride 0 is broadcast.
struct OperandView {
  int64_t rows = 0, cols = 0;
  int64_t row_stride = 0, col_stride = 0;
};

struct PipelineOptions {
  CastMode cast_mode = CastMode::eager;
  // The GEMM the epilogue belongs to; legality checks what is known of it.
  GemmDesc gemm;
  // Views of full (aux) operands, by name, for classify_loads.
  std::map<std::string, OperandView> views;
};

struct PassInfo {
  std::string_view name;
  std::string_view summary;  // what it guarantees afterwards, one line
  Graph (*run)(const Graph& g, const PipelineOptions& options);
};

// Every pass of the pipeline, in order.
std::span<const PassInfo> pipeline_passes();
const PassInfo* find_pass(std::string_view name);

// Runs the whole pipeline. `observer` (if given) sees the graph after every pass and
// whether the pass changed it.
using PassObserver = std::function<void(const PassInfo& pass, const Graph& after, bool changed)>;
Graph run_pipeline(const Graph& g, const PipelineOptions& options = {},
                   const PassObserver& observer = {});

// Whether the GEMM + epilogue can be fused on the target; reasons say why not.
struct Legality {
  bool fusable() const { return reasons.empty(); }
  std::vector<std::string> reasons;  // e.g. "K=1001 is not a multiple of 8 (bf16 A needs 16-byte rows)"
};
Legality check_legality(const Graph& g, const GemmDesc& gemm);

}  // namespace evtc
