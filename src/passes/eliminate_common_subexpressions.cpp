#include "passes/eliminate_common_subexpressions.hpp"

#include <bit>
#include <map>
#include <tuple>

#include "passes/graph_rewriter.hpp"

namespace evtc::passes {
namespace {

// Everything that decides a node's value. Constants compare by bit pattern, so -0 and +0
// stay apart and two NaN constants merge.
using ValueKey = std::tuple<NodeKind, DType, Op, uint64_t, std::array<uint64_t, kMaxOpAttrs>,
                            PairPart, std::vector<NodeId>>;

ValueKey key_of(const Node& n) {
  std::vector<NodeId> inputs = n.inputs;
  if (n.kind == NodeKind::compute && op_info(n.op).commutative && inputs.size() == 2 &&
      inputs[1] < inputs[0])
    std::swap(inputs[0], inputs[1]);
  std::array<uint64_t, kMaxOpAttrs> attrs{};
  for (int a = 0; a < kMaxOpAttrs; ++a) attrs[a] = std::bit_cast<uint64_t>(n.attrs[a]);
  const Op op = n.kind == NodeKind::compute ? n.op : Op{};
  const PairPart part = n.kind == NodeKind::pair ? n.part : PairPart{};
  return {n.kind, n.dtype, op, std::bit_cast<uint64_t>(n.value), attrs, part, std::move(inputs)};
}

bool is_mergeable(const Node& n) {
  return n.kind == NodeKind::compute || n.kind == NodeKind::cast || n.kind == NodeKind::pair ||
         (n.kind == NodeKind::scalar && n.scalar_kind == ScalarKind::constant);
}

}  // namespace

Graph eliminate_common_subexpressions(const Graph& g, const PipelineOptions&) {
  std::map<ValueKey, NodeId> seen;
  return rewrite_graph(g, [&](GraphRewriter& rw, NodeId, Node n) {
    if (!is_mergeable(n)) return rw.add(std::move(n));
    ValueKey key = key_of(n);
    if (auto it = seen.find(key); it != seen.end()) return it->second;
    const NodeId made = rw.add(std::move(n));
    seen.emplace(std::move(key), made);
    return made;
  });
}

}  // namespace evtc::passes
