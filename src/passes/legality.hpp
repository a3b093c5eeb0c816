// legality: whether the GEMM and its epilogue can run as one sm90 EVT kernel.
//
// The pass leaves the graph unchanged: it evaluates check_legality (evtc/passes.hpp) on the
// graph the backend would receive, with PipelineOptions::gemm and ::views, and writes the
// verdict to PipelineOptions::legality when that is set. It never throws for an epilogue
// that cannot be fused: the runtime falls back to an unfused epilogue and logs the reasons.
// The rules are listed in legality.cpp and docs/passes.md.
#pragma once
#include "evtc/graph.hpp"
#include "evtc/passes.hpp"

namespace evtc::passes {
Graph legality(const Graph& g, const PipelineOptions& options);
}  // namespace evtc::passes
