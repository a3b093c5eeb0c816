#include "passes/normalize_casts.h"

#include "passes/graph_rewriter.h"

namespace evtc::passes {

Graph normalize_casts(const Graph& g, const PipelineOptions& options) {
  const bool fast = options.cast_mode == CastMode::fast;
  return rewrite_graph(g, [fast](GraphRewriter& rw, NodeId, Node n) {
    switch (n.kind) {
      case NodeKind::cast: {
        const NodeId in = n.inputs[0];
        if (fast || widens_losslessly(rw.built_node(in).dtype, n.dtype)) return in;
        break;
      }
      case NodeKind::compute:
        if (fast) n.dtype = DType::f32;
        break;
      case NodeKind::store: {
        const Node& in = rw.built_node(n.inputs[0]);
        if (in.kind == NodeKind::cast && in.dtype == n.dtype) n.inputs[0] = in.inputs[0];
        break;
      }
      default: break;
    }
    return rw.add(std::move(n));
  });
}

}  // namespace evtc::passes
