// eliminate_common_subexpressions: computes every distinct value once.
//
// Guarantees afterwards: no two compute, cast or constant nodes have the same operation,
// parameters, dtype and operands, where the operands of a commutative binary op (add, mul,
// max, min) count in either order. Done here rather than left to nvcc because the EVT is
// built from this graph: two equal subtrees would become two visitor subtrees (each loading
// its operands), and fold_activations matches patterns by node identity (`x*sigmoid(x)` needs
// both x to be one node). Loads and the accumulator are already unique by name. Reductions
// are left alone: each reduction keeps its own output.
#pragma once
#include "evtc/graph.hpp"
#include "evtc/passes.hpp"

namespace evtc::passes {
Graph eliminate_common_subexpressions(const Graph& g, const PipelineOptions& options);
}  // namespace evtc::passes
