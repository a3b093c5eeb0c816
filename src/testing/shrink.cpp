#include "testing/shrink.hpp"

#include <algorithm>
#include <functional>
#include <optional>
#include <set>

#include "evtc/error.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/passes.hpp"

namespace evtc::testing {
namespace {

// Nodes reachable from the outputs other than `dropped`, with `victim` read as `replacement`.
std::vector<char> live_nodes(const Graph& g, std::optional<std::pair<NodeId, NodeId>> bypass = {},
                             std::optional<NodeId> dropped = {}) {
  std::vector<char> live(g.size(), 0);
  std::vector<NodeId> stack;
  for (NodeId out : g.outputs())
    if (out != dropped) stack.push_back(out);
  while (!stack.empty()) {
    NodeId id = stack.back();
    stack.pop_back();
    if (bypass && id == bypass->first) id = bypass->second;
    if (live[id]) continue;
    live[id] = 1;
    for (NodeId in : g.node(id).inputs) stack.push_back(in);
  }
  return live;
}

size_t live_size(const Graph& g) {
  const std::vector<char> live = live_nodes(g);
  return size_t(std::count(live.begin(), live.end(), 1));
}

bool reads_accumulator(const Graph& g) {
  const std::vector<char> live = live_nodes(g);
  for (NodeId id = 0; id < g.size(); ++id)
    if (live[id] && g.node(id).kind == NodeKind::accum) return true;
  return false;
}

// `g` with every use of `victim` reading `replacement` (one of its operands) instead, and
// without the nodes that no output reads any more. Throws UserError where the result is not a
// valid graph (an operand of another shape or type where that is not allowed).
Graph rebuild(const Graph& g, const std::vector<char>& live, NodeId victim, NodeId replacement) {
  Graph out;
  std::vector<NodeId> map(g.size(), 0);
  for (NodeId id = 0; id < g.size(); ++id) {
    if (id == victim || !live[id]) continue;
    Node n = g.node(id);
    for (NodeId& in : n.inputs) in = map[in == victim ? replacement : in];
    map[id] = out.add(std::move(n));
  }
  return out;
}

Graph bypass(const Graph& g, NodeId victim, NodeId replacement) {
  return rebuild(g, live_nodes(g, std::make_pair(victim, replacement)), victim, replacement);
}

// `g` without the output `store` and what only it read.
Graph without_output(const Graph& g, NodeId store) {
  return rebuild(g, live_nodes(g, {}, store), store, store);
}

}  // namespace

std::vector<std::string> shrink_candidates(const std::string& text, const ParseOptions& parse, const GemmDesc& gemm,
                                           size_t limit) {
  const Graph g = parse_expression(text, parse);
  const size_t size = live_size(g);
  std::vector<std::pair<size_t, std::string>> found;
  std::set<std::string> seen;
  // Every output but one, then every operation replaced by each of its operands.
  std::vector<std::function<Graph()>> steps;
  if (g.outputs().size() > 1)
    for (NodeId store : g.outputs()) steps.push_back([&g, store] { return without_output(g, store); });
  for (NodeId victim = 0; victim < g.size(); ++victim) {
    const Node& n = g.node(victim);
    if (n.kind != NodeKind::compute && n.kind != NodeKind::cast && n.kind != NodeKind::pair) continue;
    for (NodeId operand : std::set<NodeId>(n.inputs.begin(), n.inputs.end()))
      steps.push_back([&g, victim, operand] { return bypass(g, victim, operand); });
  }
  for (const auto& step : steps) {
    try {
      const std::string candidate = expression_text(step());
      if (seen.count(candidate)) continue;
      seen.insert(candidate);
      const Graph again = parse_expression(candidate, parse);
      const size_t smaller = live_size(again);
      if (smaller >= size || !reads_accumulator(again) || !check_legality(again, gemm).fusable()) continue;
      found.emplace_back(smaller, candidate);
    } catch (const UserError&) {
      // Not a valid epilogue (an output of another shape, a type that does not widen): skip.
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (size_t i = 0; i < found.size() && i < limit; ++i) out.push_back(std::move(found[i].second));
  return out;
}

ShrinkResult shrink(const std::string& text, const ParseOptions& parse, const GemmDesc& gemm,
                    const std::function<int(const std::vector<std::string>&)>& failing, int max_rounds,
                    size_t batch) {
  ShrinkResult r{text};
  batch = std::max<size_t>(batch, 1);
  std::vector<std::string> candidates = shrink_candidates(r.text, parse, gemm);
  size_t next = 0;  // the first candidate of the current epilogue not offered yet
  while (r.rounds < max_rounds && next < candidates.size()) {
    const std::vector<std::string> offered(candidates.begin() + long(next),
                                           candidates.begin() + long(std::min(candidates.size(), next + batch)));
    ++r.rounds;
    r.tried += int(offered.size());
    const int failed = failing(offered);
    if (failed >= 0 && size_t(failed) < offered.size()) {
      r.text = offered[size_t(failed)];
      candidates = shrink_candidates(r.text, parse, gemm);
      next = 0;
    } else {
      next += offered.size();
    }
  }
  return r;
}

}  // namespace evtc::testing
