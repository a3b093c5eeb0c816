// verify: checks that a graph is a well-formed epilogue before anything else looks at it.
//
// Guarantees afterwards (else it throws a UserError naming the offending node):
//  - every node has its op's arity, operands defined before it (so the graph has no
//    cycles), and the dtype and shape its operands imply (each node is rebuilt through
//    Graph::add, which runs every constructor check again);
//  - there is exactly one accumulator and at least one output;
//  - every output depends on the accumulator (an output computed without acc is not a GEMM
//    epilogue, and an epilogue that never reads acc is rejected by the same rule).
// The graph itself is returned unchanged.
#pragma once
#include "evtc/graph.hpp"
#include "evtc/passes.hpp"

namespace evtc::passes {
Graph verify(const Graph& g, const PipelineOptions& options);
}  // namespace evtc::passes
