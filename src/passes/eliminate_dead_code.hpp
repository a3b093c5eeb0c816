// eliminate_dead_code: keeps only what some output reads.
//
// Guarantees afterwards: every node reaches an output; operands (vectors, aux matrices,
// parameters, C) that no output reads are gone, so the kernel neither asks for nor binds
// them.
#pragma once
#include "evtc/graph.hpp"
#include "evtc/passes.hpp"

namespace evtc::passes {
Graph eliminate_dead_code(const Graph& g, const PipelineOptions& options);
}  // namespace evtc::passes
