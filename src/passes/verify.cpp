#include "passes/verify.hpp"

#include <fmt/format.h>

#include "evtc/error.hpp"
#include "passes/graph_rewriter.hpp"

namespace evtc::passes {
namespace {

[[noreturn]] void fail(const Graph& g, NodeId id, const std::string& what) {
  throw UserError(fmt::format("verify: {}: {}", g.describe(id), what));
}

void check_structure(const Graph& g) {
  for (NodeId i = 0; i < g.size(); ++i)
    for (NodeId in : g.node(i).inputs)
      if (in >= i) fail(g, i, fmt::format("operand %{} is not defined before its user", in));
}

// Which nodes depend on the accumulator.
std::vector<bool> reads_accumulator(const Graph& g) {
  std::vector<bool> reads(g.size(), false);
  for (NodeId i = 0; i < g.size(); ++i) {
    const Node& n = g.node(i);
    reads[i] = n.kind == NodeKind::accum;
    for (NodeId in : n.inputs) reads[i] = reads[i] || reads[in];
  }
  return reads;
}

}  // namespace

Graph verify(const Graph& g, const PipelineOptions&) {
  check_structure(g);

  const Graph rebuilt = rewrite_graph(g, [&](GraphRewriter& rw, NodeId id, Node n) {
    NodeId made;
    try {
      made = rw.add(n);
    } catch (const UserError& e) {
      fail(g, id, e.what());
    }
    const Node& m = rw.built_node(made);
    if (m.dtype != n.dtype || m.shape != n.shape)
      fail(g, id,
           fmt::format("is typed {}{} but its operands make it {}{}", dtype_name(n.dtype),
                       shape_name(n.shape), dtype_name(m.dtype), shape_name(m.shape)));
    return made;
  });

  int accums = 0;
  for (const Node& n : g.nodes()) accums += n.kind == NodeKind::accum;
  if (accums != 1)
    throw UserError(accums == 0 ? "verify: the epilogue never reads the accumulator acc"
                                : "verify: the graph has more than one accumulator");
  if (g.outputs().empty()) throw UserError("verify: the epilogue has no output");
  const std::vector<bool> reads = reads_accumulator(g);
  for (NodeId o : g.outputs())
    if (!reads[o])
      fail(g, o,
           fmt::format("output '{}' does not depend on the accumulator acc; every output of "
                       "a GEMM epilogue must be computed from it",
                       g.node(o).name));
  return rebuilt;
}

}  // namespace evtc::passes
