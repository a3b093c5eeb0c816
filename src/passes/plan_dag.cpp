#include "passes/plan_dag.h"

#include "passes/graph_rewriter.h"

namespace evtc {

DagPlan plan_dag(const Graph& g) {
  // Only uses by nodes that reach an output count: a dead user is never emitted.
  const std::vector<bool> live = passes::live_nodes(g);
  std::vector<int> uses(g.size(), 0);
  for (NodeId i = 0; i < g.size(); ++i)
    if (live[i])
      for (NodeId in : g.node(i).inputs) ++uses[in];
  DagPlan plan;
  plan.shared.assign(g.size(), false);
  for (NodeId i = 0; i < g.size(); ++i) {
    const NodeKind k = g.node(i).kind;
    plan.shared[i] = uses[i] > 1 && (k == NodeKind::compute || k == NodeKind::cast || k == NodeKind::pair);
  }
  return plan;
}

}  // namespace evtc
