#include "passes/graph_rewriter.hpp"

#include <limits>

#include "evtc/error.hpp"

namespace evtc::passes {
namespace {
constexpr NodeId kNoImage = std::numeric_limits<NodeId>::max();
}  // namespace

GraphRewriter::GraphRewriter(const Graph& old) : old_(old), image_(old.size(), kNoImage) {}

bool GraphRewriter::has_image(NodeId old_id) const { return image_.at(old_id) != kNoImage; }

NodeId GraphRewriter::image(NodeId old_id) const {
  EVTC_INTERNAL_ASSERT(has_image(old_id), "operand rewritten after its user");
  return image_[old_id];
}

Node GraphRewriter::translated(NodeId id) const {
  Node n = old_.node(id);
  for (NodeId& in : n.inputs) in = image(in);
  return n;
}

NodeId GraphRewriter::constant(double value, DType dtype) {
  return built_.constant(value, dtype).id;
}

NodeId GraphRewriter::compute(Op op, std::vector<NodeId> inputs, DType dtype,
                              const std::array<double, kMaxOpAttrs>& attrs) {
  Node n;
  n.kind = NodeKind::compute;
  n.op = op;
  n.dtype = dtype;
  n.inputs = std::move(inputs);
  n.attrs = attrs;
  return add(std::move(n));
}

std::vector<bool> live_nodes(const Graph& g) {
  std::vector<bool> live(g.size(), false);
  for (NodeId o : g.outputs()) live[o] = true;
  // Ids are topological (operands are created before their users), so one backward sweep
  // propagates liveness from every user to its operands.
  for (NodeId i = static_cast<NodeId>(g.size()); i-- > 0;)
    if (live[i])
      for (NodeId in : g.node(i).inputs) live[in] = true;
  return live;
}

Graph GraphRewriter::finish(OldDeadCode dead) const {
  std::vector<bool> keep = live_nodes(built_);
  if (dead == OldDeadCode::keep) {
    // Dead code is kept as its dead roots (nodes nothing uses) now compute it: a rewrite
    // inside it may orphan what it read (relu(x*1) no longer reads the constant 1).
    const std::vector<bool> old_live = live_nodes(old_);
    std::vector<bool> used(old_.size(), false);
    for (const Node& n : old_.nodes())
      for (NodeId in : n.inputs) used[in] = true;
    for (NodeId i = 0; i < old_.size(); ++i)
      if (!old_live[i] && !used[i] && has_image(i)) keep[image_[i]] = true;
    for (NodeId i = static_cast<NodeId>(built_.size()); i-- > 0;)
      if (keep[i])
        for (NodeId in : built_.node(i).inputs) keep[in] = true;
  }
  Graph out;
  std::vector<NodeId> remap(built_.size(), kNoImage);
  for (NodeId i = 0; i < built_.size(); ++i) {
    if (!keep[i]) continue;
    Node n = built_.node(i);
    for (NodeId& in : n.inputs) in = remap[in];
    remap[i] = out.add(std::move(n));
  }
  return out;
}

Graph rewrite_graph(const Graph& old, const RewriteRule& rule, GraphRewriter::OldDeadCode dead) {
  GraphRewriter rw(old);
  for (NodeId i = 0; i < old.size(); ++i) rw.set_image(i, rule(rw, i, rw.translated(i)));
  return rw.finish(dead);
}

}  // namespace evtc::passes
