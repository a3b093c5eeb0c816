// The epilogue pass pipeline (src/passes/pipeline.cpp lists the passes in order; docs/passes.md
// describes each one).
#pragma once
#include <cstdint>
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
//  eager:   round where PyTorch eager would materialise a lower-precision tensor, so fused
//           results follow eager's rounding;
//  fast:    compute in f32 throughout and round once at each store;
//  compile: round as a compiler fusing the ops does (Inductor): the GEMM's own 16-bit result,
//           which the library GEMM writes, stays rounded (the accumulator, or an affine function
//           of it with broadcast operands only: addmm's bias, _scaled_mm's scales); other
//           roundings to bf16 or f16 between ops are elided and those ops compute in f32; casts
//           to other types (fp8) stay.
enum class CastMode { eager, fast, compile };

// The modes' names ("eager", "fast", "compile"), as options, the CLI and Python spell them.
std::string_view cast_mode_name(CastMode mode);
// The mode of that name, if it is one.
std::optional<CastMode> cast_mode_named(std::string_view name);
// Every mode's name, in the order above.
const std::vector<std::string>& cast_mode_names();

// An operand bound as an M×N view: its logical shape and element strides.
// A dimension of size 1 or stride 0 is broadcast.
struct OperandView {
  int64_t rows = 0, cols = 0;
  int64_t row_stride = 0, col_stride = 0;
};

struct Legality;

struct PipelineOptions {
  CastMode cast_mode = CastMode::eager;
  // The GEMM the epilogue belongs to; legality checks what is known of it.
  GemmDesc gemm;
  // Views of full (aux) operands, by name, for classify_loads.
  std::map<std::string, OperandView> views;
  // If set, the legality pass writes its verdict on the final graph here.
  Legality* legality = nullptr;
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
// whether the pass changed it (its canonical print differs). The result's nodes are numbered
// in canonical order (evtc/ir_text.hpp), so equal graphs give equal results node for node.
using PassObserver = std::function<void(const PassInfo& pass, const Graph& after, bool changed)>;
Graph run_pipeline(const Graph& g, const PipelineOptions& options = {},
                   const PassObserver& observer = {});

// The longest chain of operations from an input (acc, an operand, a constant) to an output:
// a fused epilogue nests one CUTLASS visitor per operation along it, and nvcc's template
// limits bound that nesting (chains of 48 compile, 54 do not). Counted without recursion, so
// graphs of any depth are measured.
inline constexpr size_t kMaxEpilogueDepth = 48;
size_t epilogue_depth(const Graph& g);
// Why the graph is too deep to fuse (empty when it is not); legality and the grouped kernels'
// checks both use it.
std::string depth_refusal(const Graph& g);

// Whether the GEMM + epilogue can be fused on the target; reasons say why not.
struct Legality {
  bool fusable() const { return reasons.empty(); }
  std::vector<std::string> reasons;  // e.g. "K=1001 is not a multiple of 8 (bf16 A needs 16-byte rows)"
};
Legality check_legality(const Graph& g, const GemmDesc& gemm);
// The same, and also refuses aux operands whose bound view classify_view cannot place.
Legality check_legality(const Graph& g, const GemmDesc& gemm,
                        const std::map<std::string, OperandView>& views);

// Swap-AB (src/passes/swap_ab.cpp): the GEMM computed transposed, Dᵀ = Bᵀ·Aᵀ, for problems
// whose M is too small to fill a tile's rows. The graph is rewritten node for node for the
// transposed problem ([n] and [m] vectors exchanged, [m,n] operands, C and outputs in the other
// layout, row and column reductions exchanged); the GEMM's M and N, A and B are exchanged.
// Outputs keep their names and buffers. Applying it twice gives the original back.
struct SwappedProblem {
  Graph graph;
  GemmDesc gemm;
};
// Why this epilogue cannot be computed transposed (empty when it can): gated [m,n/2] values
// pair adjacent columns, which the transposed kernel's threads do not hold together; a
// block-scaled fp8 GEMM's scales are laid out for the untransposed operands.
std::string swap_ab_refusal(const Graph& g, const GemmDesc& gemm);
// The transposed problem; a UserError with the refusal's reason when there is one.
SwappedProblem swap_ab(const Graph& g, const GemmDesc& gemm);
// The GEMM alone as the transposed kernel computes it: M and N, A's and B's dtypes exchanged,
// and A' = Bᵀ, B' = Aᵀ in the other layouts (SwappedProblem::gemm).
GemmDesc swapped_gemm(const GemmDesc& gemm);

// How an M×N operand view is read by a fused kernel (see classify_view).
enum class LoadClass {
  scalar,         // strides (0,0): one value, read by pointer
  row_vec,        // (0,1) or shape 1×N: length N, broadcast over M
  col_vec,        // (1,0) or shape M×1: length M, broadcast over N
  aux_row_major,  // (N,1): a full M×N operand
  aux_col_major,  // (1,M): a full M×N operand, column-major
  not_fusable,    // anything else; `why` says what is wrong
};
std::string_view load_class_name(LoadClass c);

// Classifies a view of an operand of an M×N epilogue. m or n may be 0 (unknown): the view's
// own rows or cols stand in for it. A view dimension of size 1 is broadcast whatever its
// stride. For not_fusable, *why (if given) receives a sentence saying why.
LoadClass classify_view(const OperandView& view, int64_t m, int64_t n, std::string* why);

// Where a strided N-D tensor goes when an epilogue of N-D logical shape `full` reads it
// (PyTorch's broadcasting: trailing dimensions align; the leading dimensions of `full`
// flatten to M, its last is N). Front ends that hold framework tensors (the PyTorch FX pass
// at trace time, its ops at run time) place every operand with this one rule.
struct OperandPlacement {
  // scalar, row_vec, col_vec, aux_row_major or aux_col_major; not_fusable with `why`.
  LoadClass load = LoadClass::not_fusable;
  // The tensor's own strides do not give the class's layout (a vector whose elements are
  // not adjacent, a matrix that is neither row- nor column-major): it is read from a
  // contiguous copy.
  bool needs_copy = false;
  std::string why;
};
OperandPlacement place_operand(std::span<const int64_t> sizes, std::span<const int64_t> strides,
                               std::span<const int64_t> full);

// How the backend lowers nodes that have more than one use (a DAG, where EVT is a tree).
struct DagPlan {
  // Indexed by NodeId: true when the node is computed once and its value shared by all its
  // uses (a CUTLASS topological visitor); false when each use re-emits it (a tree node).
  std::vector<bool> shared;
  // The main output's value (what the collective epilogue stores as D), when there is one,
  // and the other outputs' stores, by name.
  std::optional<NodeId> d_value;
  std::vector<NodeId> terminals;
  // true: the epilogue is one nested tree (one output and nothing shared); false: a
  // topological visitor whose entries are the `materialised` values (the shared ones, D's
  // value, and every operand of an op one of whose operand trees reaches a materialised
  // value, since a tree node cannot take inputs from a topological visitor), each computed
  // once, with the values between them as nested trees.
  bool tree = true;
  std::vector<bool> materialised;
  // Indexed by NodeId: how many times the backend emits each load (a leaf): once when it is
  // materialised, else once per live use. Every emitted aux load or row broadcast has shared
  // memory of its own, which the shared-memory model counts.
  std::vector<int> reads;
};
// d_name: the output the collective epilogue stores as D ("" when none does).
DagPlan plan_dag(const Graph& g, std::string_view d_name = "");
// Whether an op with these operands takes them as topological-visitor entries: one of them is
// materialised, or the tree below one of them reaches a materialised value (a tree node
// cannot take inputs from a topological visitor).
bool reaches_materialised(const Graph& g, const std::vector<bool>& materialised, const std::vector<NodeId>& operands);
// The values an output store consumes: its input, or a reduction's input.
std::vector<NodeId> store_operands(const Graph& g, NodeId store);

}  // namespace evtc
