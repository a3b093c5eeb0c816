// swap_ab: D = epilogue(A·B) computed as Dᵀ = epilogue'(Bᵀ·Aᵀ).
//
// A kernel for small M spends its tile's rows on padding: a 64-row tile of a 16-row problem
// multiplies 48 rows of zeros and stages them in shared memory. Transposed, the problem's N
// (thousands of weight rows) fills the tile's rows and its M the tile's columns, which can be
// as narrow as 16. The epilogue graph is rewritten for the transposed problem, node for node:
//  - an [n] row vector becomes an [m'] column vector, and an [m] column vector a row vector;
//    likewise the column index n becomes the row index m' of the transposed problem, and m n';
//  - [m,n] operands, the source C and [m,n] outputs (D included) keep their memory and change
//    layout (a row-major M×N matrix is the column-major N×M matrix of its transpose);
//  - a reduction over N (one value per row) becomes one over M', and the other way round;
//  - scalars and elementwise operations are unchanged.
// The graph's outputs keep their names, order and buffers; only the kernel's view of them
// changes, so a caller binds the same tensors and the run path swaps A with B, M with N and
// their leading dimensions (runtime::swapped_arguments).
#include "passes/swap_ab.hpp"

#include <fmt/format.h>

#include "evtc/error.hpp"

namespace evtc {

namespace {

Layout flipped(Layout l) { return l == Layout::row_major ? Layout::col_major : Layout::row_major; }

}  // namespace

std::string swap_ab_refusal(const Graph& g, const GemmDesc& gemm) {
  if (gemm.fp8_blockwise)
    return "a block-scaled fp8 GEMM's scales are laid out for A's rows and B's 128×128 blocks";
  for (NodeId id = 0; id < g.size(); ++id) {
    const Node& n = g.node(id);
    if (n.kind == NodeKind::pair)
      return fmt::format("the gated value {} pairs adjacent columns of N, which the transposed kernel holds in "
                         "different threads",
                         g.describe(id));
  }
  return "";
}

SwappedProblem swap_ab(const Graph& g, const GemmDesc& gemm) {
  if (std::string why = swap_ab_refusal(g, gemm); !why.empty())
    throw UserError("the GEMM cannot be computed transposed (swap-AB): " + why);
  SwappedProblem out;
  // Node for node, in id order: every input is mapped before its users.
  std::vector<NodeId> map(g.size());
  for (NodeId id = 0; id < g.size(); ++id) {
    Node n = g.node(id);
    for (NodeId& in : n.inputs) in = map[in];
    switch (n.kind) {
      case NodeKind::row_vec: n.kind = NodeKind::col_vec; break;
      case NodeKind::col_vec: n.kind = NodeKind::row_vec; break;
      case NodeKind::index: n.index_axis = n.index_axis == IndexAxis::m ? IndexAxis::n : IndexAxis::m; break;
      case NodeKind::aux:
      case NodeKind::source: n.layout = flipped(n.layout); break;
      case NodeKind::store:
        if (g.node(g.node(id).inputs[0]).kind != NodeKind::reduce) n.layout = flipped(n.layout);
        break;
      case NodeKind::reduce:
        if (n.axis != ReduceAxis::all) n.axis = n.axis == ReduceAxis::row ? ReduceAxis::col : ReduceAxis::row;
        break;
      default: break;
    }
    map[id] = out.graph.add(std::move(n));
  }
  out.gemm = swapped_gemm(gemm);
  return out;
}

GemmDesc swapped_gemm(const GemmDesc& gemm) {
  GemmDesc out = gemm;
  std::swap(out.m, out.n);
  std::swap(out.a_dtype, out.b_dtype);
  // A' = Bᵀ (N×K) and B' = Aᵀ (K×M): a column-major K×N B is a row-major N×K Bᵀ.
  out.a_layout = flipped(gemm.b_layout);
  out.b_layout = flipped(gemm.a_layout);
  return out;
}

}  // namespace evtc
