// GraphRewriter: the one way passes build a new graph from an old one.
//
// Graphs are immutable once built (nodes are added through Graph's checking constructors and
// never removed), so a pass rebuilds: it visits the old graph's nodes operands-first, and for
// each one decides which node of the new graph stands for it (its "image"). Rewrites leave
// orphans behind in the graph under construction (x*1 -> x leaves the constant 1); finish()
// drops them, so a pass's output holds only what it means to keep.
#pragma once
#include <functional>
#include <vector>

#include "evtc/graph.hpp"

namespace evtc::passes {

class GraphRewriter {
 public:
  explicit GraphRewriter(const Graph& old);

  const Graph& old() const { return old_; }
  // The graph under construction.
  Graph& built() { return built_; }
  const Graph& built() const { return built_; }
  const Node& built_node(NodeId id) const { return built_.node(id); }

  // Node `id` of the old graph with its operands replaced by their images (which must exist).
  Node translated(NodeId id) const;
  // Adds a node to the new graph through Graph::add (every check runs again).
  NodeId add(Node n) { return built_.add(std::move(n)); }
  NodeId constant(double value, DType dtype);
  NodeId compute(Op op, std::vector<NodeId> inputs, DType dtype,
                 const std::array<double, kMaxOpAttrs>& attrs = {});

  void set_image(NodeId old_id, NodeId new_id) { image_.at(old_id) = new_id; }
  NodeId image(NodeId old_id) const;
  bool has_image(NodeId old_id) const;

  // What becomes of nodes no output of the old graph reaches.
  enum class OldDeadCode { keep, drop };
  // Returns the new graph: every output's image and what it reads, plus (keep) the images of
  // the old graph's dead roots (unused nodes that reach no output) and what they read; nodes
  // only the rewrites orphaned are dropped.
  Graph finish(OldDeadCode dead = OldDeadCode::keep) const;

 private:
  const Graph& old_;
  Graph built_;
  std::vector<NodeId> image_;
};

// For each node of `old` in id order (operands before users), `rule` is given the node with
// its operands translated and returns its image; the common case is `rw.add(std::move(n))`.
using RewriteRule = std::function<NodeId(GraphRewriter& rw, NodeId old_id, Node translated)>;
Graph rewrite_graph(const Graph& old, const RewriteRule& rule,
                    GraphRewriter::OldDeadCode dead = GraphRewriter::OldDeadCode::keep);

// Which nodes reach an output (the outputs included).
std::vector<bool> live_nodes(const Graph& g);

}  // namespace evtc::passes
