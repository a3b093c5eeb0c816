#include "passes/plan_dag.hpp"

#include <algorithm>

#include "passes/graph_rewriter.hpp"

namespace evtc {

std::vector<NodeId> store_operands(const Graph& g, NodeId store) {
  const Node& n = g.node(store);
  if (n.kind != NodeKind::store) return n.inputs;
  const Node& in = g.node(n.inputs[0]);
  return in.kind == NodeKind::reduce ? in.inputs : n.inputs;
}

bool reaches_materialised(const Graph& g, const std::vector<bool>& mat, const std::vector<NodeId>& operands) {
  auto reaches = [&](auto&& self, NodeId v) -> bool {  // v or its tree (below v) hits a materialised value
    if (mat[v]) return true;
    for (NodeId in : g.node(v).inputs)
      if (self(self, in)) return true;
    return false;
  };
  for (NodeId in : operands)
    if (reaches(reaches, in)) return true;
  return false;
}

DagPlan plan_dag(const Graph& g, std::string_view d_name) {
  // Only uses by nodes that reach an output count: a dead user is never emitted.
  const std::vector<bool> live = passes::live_nodes(g);
  std::vector<int> uses(g.size(), 0);
  for (NodeId i = 0; i < g.size(); ++i)
    if (live[i])
      for (NodeId in : g.node(i).inputs) ++uses[in];
  DagPlan plan;
  plan.shared.assign(g.size(), false);
  bool any_shared = false;
  for (NodeId i = 0; i < g.size(); ++i) {
    const NodeKind k = g.node(i).kind;
    plan.shared[i] = uses[i] > 1 && (k == NodeKind::compute || k == NodeKind::cast || k == NodeKind::pair);
    any_shared = any_shared || plan.shared[i];
  }

  for (NodeId id : g.outputs()) {
    const Node& s = g.node(id);
    if (!d_name.empty() && s.name == d_name) plan.d_value = s.inputs[0];
    else plan.terminals.push_back(id);
  }
  std::sort(plan.terminals.begin(), plan.terminals.end(),
            [&](NodeId a, NodeId b) { return g.node(a).name < g.node(b).name; });

  plan.materialised.assign(g.size(), false);
  const size_t outputs = plan.terminals.size() + (plan.d_value ? 1 : 0);
  plan.tree = !any_shared && outputs <= 1;
  if (!plan.tree) {
    std::vector<bool>& mat = plan.materialised;
    for (NodeId i = 0; i < g.size(); ++i) mat[i] = plan.shared[i];
    if (plan.d_value) mat[*plan.d_value] = true;
    for (bool changed = true; changed;) {
      changed = false;
      std::vector<std::vector<NodeId>> op_sets;
      for (NodeId v = 0; v < g.size(); ++v)
        if (mat[v]) op_sets.push_back(g.node(v).inputs);
      for (NodeId t : plan.terminals) op_sets.push_back(store_operands(g, t));
      for (const auto& ins : op_sets) {
        if (!reaches_materialised(g, mat, ins)) continue;
        for (NodeId in : ins)
          if (!mat[in]) mat[in] = changed = true;
      }
    }
  }
  plan.reads.assign(g.size(), 0);
  for (NodeId i = 0; i < g.size(); ++i)
    if (g.node(i).is_load() && uses[i] > 0) plan.reads[i] = plan.materialised[i] ? 1 : uses[i];
  return plan;
}

}  // namespace evtc
