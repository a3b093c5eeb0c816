// fold_activations: recognises activation functions written out in elementary ops (as
// PyTorch decompositions and hand-written epilogues spell them) and replaces each by the
// op-table's native op, which the device computes with one tuned functor instead of a chain
// of exp/div/erf visitor nodes.
//
// Guarantees afterwards: no subgraph matches an entry of the activation table
// (fold_activations.cpp, kActivationRules) whose intermediate nodes are used only inside the
// match. Where an intermediate value is used elsewhere too, the decomposition stays as
// written: folding would compute that part twice. Only decompositions computed in f32 are
// folded (in bf16 or f16 each step rounds, and eager mode keeps what the user wrote).
// Matching is commutativity-aware and compares constants with a relative tolerance of 1e-4
// (expression_pattern.h). Folds that produce equal nodes (x/(1+exp(-x)) and x*sigmoid(x)
// over one x) are merged, so the output has no common subexpressions its input lacked.
// Values are unchanged up to the native op's own rounding, except that relu and relu_square
// map NaN to 0 where max(x, 0) propagates it (docs/passes.md).
#pragma once
#include <span>
#include <string_view>

#include "evtc/graph.hpp"
#include "evtc/passes.hpp"

namespace evtc::passes {
Graph fold_activations(const Graph& g, const PipelineOptions& options);

// The table's entries, for documentation and tests: what each recognises and what it becomes.
struct ActivationRuleInfo {
  std::string_view spelling;
  Op native;
};
std::vector<ActivationRuleInfo> activation_rules();
}  // namespace evtc::passes
