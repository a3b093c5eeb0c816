#include "testing/shrink.hpp"

#include <algorithm>
#include <set>

#include "evtc/error.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/passes.hpp"
#include "passes/graph_rewriter.hpp"

namespace evtc::testing {
namespace {

using passes::GraphRewriter;

// How many nodes reach an output, and whether the accumulator is one of them.
struct Reach {
  size_t size = 0;
  bool reads_accumulator = false;
};

Reach reach(const Graph& g) {
  const std::vector<bool> live = passes::live_nodes(g);
  Reach r;
  for (NodeId id = 0; id < g.size(); ++id)
    if (live[id]) {
      ++r.size;
      r.reads_accumulator |= g.node(id).kind == NodeKind::accum;
    }
  return r;
}

// `g` with every use of `victim` reading `replacement` (one of its operands) instead; with
// victim an output and replacement its value, `g` without that output. Nodes no output reads
// any more are dropped. Throws UserError where the result is not a valid graph (an operand of
// another shape or type where that is not allowed).
Graph bypass(const Graph& g, NodeId victim, NodeId replacement) {
  return passes::rewrite_graph(
      g,
      [&](GraphRewriter& rw, NodeId id, Node n) { return id == victim ? rw.image(replacement) : rw.add(std::move(n)); },
      GraphRewriter::OldDeadCode::drop);
}

}  // namespace

std::vector<std::string> shrink_candidates(const std::string& text, const ParseOptions& parse, const GemmDesc& gemm,
                                           size_t limit) {
  const Graph g = parse_expression(text, parse);
  const size_t size = reach(g).size;
  std::vector<std::pair<size_t, std::string>> found;
  std::set<std::string> seen;
  auto consider = [&](NodeId victim, NodeId replacement) {
    try {
      const std::string candidate = expression_text(bypass(g, victim, replacement));
      if (!seen.insert(candidate).second) return;
      const Graph again = parse_expression(candidate, parse);
      const Reach r = reach(again);
      if (r.size < size && r.reads_accumulator && check_legality(again, gemm).fusable())
        found.emplace_back(r.size, candidate);
    } catch (const UserError&) {
      // Not a valid epilogue (an output of another shape, a type that does not widen): skip.
    }
  };
  // Every output but one, then every operation replaced by each of its operands.
  if (g.outputs().size() > 1)
    for (NodeId store : g.outputs()) consider(store, g.node(store).inputs[0]);
  for (NodeId victim = 0; victim < g.size(); ++victim) {
    const Node& n = g.node(victim);
    if (n.kind != NodeKind::compute && n.kind != NodeKind::cast && n.kind != NodeKind::pair) continue;
    for (NodeId operand : std::set<NodeId>(n.inputs.begin(), n.inputs.end())) consider(victim, operand);
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
