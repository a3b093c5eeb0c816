#include "passes/normalize_casts.hpp"

#include "passes/graph_rewriter.hpp"

namespace evtc::passes {

std::optional<NodeId> value_preserving_cast_operand(const Graph& built, const Node& cast) {
  if (cast.kind != NodeKind::cast) return std::nullopt;
  const NodeId in = cast.inputs[0];
  // widens_losslessly(t, t) holds: a cast to the operand's own dtype is one of these.
  if (widens_losslessly(built.node(in).dtype, cast.dtype)) return in;
  return std::nullopt;
}

Node store_without_same_rounding(const Graph& built, Node store) {
  if (store.kind != NodeKind::store) return store;
  const Node& in = built.node(store.inputs[0]);
  if (in.kind == NodeKind::cast && in.dtype == store.dtype) store.inputs[0] = in.inputs[0];
  return store;
}

Graph normalize_casts(const Graph& g, const PipelineOptions& options) {
  const bool fast = options.cast_mode == CastMode::fast;
  return rewrite_graph(g, [fast](GraphRewriter& rw, NodeId, Node n) {
    switch (n.kind) {
      case NodeKind::cast:
        if (fast) return n.inputs[0];
        if (auto in = value_preserving_cast_operand(rw.built(), n)) return *in;
        break;
      case NodeKind::compute:
        if (fast) n.dtype = DType::f32;
        break;
      case NodeKind::store: n = store_without_same_rounding(rw.built(), std::move(n)); break;
      default: break;
    }
    return rw.add(std::move(n));
  });
}

}  // namespace evtc::passes
