// The pass pipeline: one list, in order. Why this order:
//  verify first, so every later pass may assume a well-formed epilogue;
//  normalize_casts next: removing no-op casts (and, in fast mode, every cast, computing in
//    f32 throughout) exposes constants to fold, duplicates to merge and activation patterns
//    such as x*sigmoid(x) that a cast between the two hid, while the casts eager mode keeps
//    still stop a fold across a rounding;
//  fold_constants before CSE, so constants that fold to the same value merge;
//  CSE before activation folding, whose patterns need `x` to be one node;
//  DCE before activation folding, whose folds need intermediates used only by the pattern;
//  classify_loads late, so its vectors and scalars are what the backend sees;
//  legality last, on the graph the backend receives.
// No pass leaves work for an earlier one, so running the pipeline twice changes nothing.
#include "evtc/ir_text.hpp"
#include "evtc/passes.hpp"
#include "passes/classify_loads.hpp"
#include "passes/eliminate_common_subexpressions.hpp"
#include "passes/eliminate_dead_code.hpp"
#include "passes/fold_activations.hpp"
#include "passes/fold_constants.hpp"
#include "passes/legality.hpp"
#include "passes/normalize_casts.hpp"
#include "passes/verify.hpp"

namespace evtc {
namespace {

constexpr PassInfo kPipeline[] = {
    {"verify", "the graph is a well-formed epilogue: one accumulator, outputs computed from it",
     passes::verify},
    {"normalize_casts", "casts only where the cast mode rounds (no no-op casts)",
     passes::normalize_casts},
    {"fold_constants", "no constant subtrees and no x*1, x+0, x-0, x/1, --x identities",
     passes::fold_constants},
    {"eliminate_common_subexpressions", "every distinct value is computed by one node",
     passes::eliminate_common_subexpressions},
    {"eliminate_dead_code", "every node and operand reaches an output",
     passes::eliminate_dead_code},
    {"fold_activations", "decomposed activations are native ops (silu, gelu, clamp, ...)",
     passes::fold_activations},
    {"classify_loads", "aux operands with a view are read as scalar, vector or matrix loads",
     passes::classify_loads},
    {"legality", "unchanged; the fusion verdict is in PipelineOptions::legality",
     passes::legality},
};

}  // namespace

std::span<const PassInfo> pipeline_passes() { return kPipeline; }

const PassInfo* find_pass(std::string_view name) {
  for (const PassInfo& p : kPipeline)
    if (p.name == name) return &p;
  return nullptr;
}

Graph run_pipeline(const Graph& g, const PipelineOptions& options, const PassObserver& observer) {
  Graph current = g;
  for (const PassInfo& pass : kPipeline) {
    Graph after = pass.run(current, options);
    if (observer) observer(pass, after, print(current) != print(after));
    current = std::move(after);
  }
  // Nodes renumbered in canonical order: the code generated from the result (value names, the
  // order of operand slots) is then the same however the epilogue was written, so equal
  // epilogues share their kernels, cache keys and library entries.
  return parse_canonical(print(current));
}

}  // namespace evtc
