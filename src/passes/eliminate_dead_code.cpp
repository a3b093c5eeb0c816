#include "passes/eliminate_dead_code.hpp"

#include "passes/graph_rewriter.hpp"

namespace evtc::passes {

Graph eliminate_dead_code(const Graph& g, const PipelineOptions&) {
  return rewrite_graph(
      g, [](GraphRewriter& rw, NodeId, Node n) { return rw.add(std::move(n)); },
      GraphRewriter::OldDeadCode::drop);
}

}  // namespace evtc::passes
