#include "passes/fold_constants.hpp"

#include <cmath>
#include <limits>
#include <optional>

#include "passes/graph_rewriter.hpp"
#include "passes/normalize_casts.hpp"

namespace evtc::passes {
namespace {

// NaN results fold to one NaN, whatever sign or payload the host's arithmetic produced
// (x86 makes 0*inf a negative NaN), so the folded graph prints the same everywhere.
constexpr double kCanonicalNaN = std::numeric_limits<double>::quiet_NaN();

class ConstantFolder {
 public:
  explicit ConstantFolder(GraphRewriter& rw) : rw_(rw) {}

  // The image of a node whose operands are already images.
  NodeId fold(Node n) {
    if (n.kind == NodeKind::cast) {
      if (auto c = constant_value(n.inputs[0])) return folded(round_to(n.dtype, *c), n.dtype);
      // Identities can leave casts that change no value (cast(x*1, bf16) with x bf16);
      // removing them here too keeps the pipeline from needing normalize_casts again.
      if (auto in = value_preserving_cast_operand(rw_.built(), n)) return *in;
      return rw_.add(std::move(n));
    }
    if (n.kind == NodeKind::store) return rw_.add(store_without_same_rounding(rw_.built(), std::move(n)));
    if (n.kind != NodeKind::compute) return rw_.add(std::move(n));
    if (auto v = evaluate(n)) return folded(*v, n.dtype);
    if (auto x = identity_operand(n)) return *x;
    if (auto r = reassociate(n)) return *r;
    if (auto p = small_power(n)) return *p;
    return rw_.add(std::move(n));
  }

 private:
  const Node& node(NodeId id) const { return rw_.built_node(id); }
  NodeId folded(double v, DType dtype) { return rw_.constant(std::isnan(v) ? kCanonicalNaN : v, dtype); }

  std::optional<double> constant_value(NodeId id) const {
    const Node& n = node(id);
    if (n.kind == NodeKind::scalar && n.scalar_kind == ScalarKind::constant) return n.value;
    return std::nullopt;
  }
  bool is_constant(NodeId id, double v) const {
    auto c = constant_value(id);
    return c && *c == v;
  }

  std::optional<double> evaluate(const Node& n) const {
    std::vector<double> args;
    for (NodeId in : n.inputs) {
      auto c = constant_value(in);
      if (!c) return std::nullopt;
      args.push_back(*c);
    }
    const OpInfo& info = op_info(n.op);
    return round_to(n.dtype, info.cpu(args, std::span<const double>(n.attrs.data(), info.num_attrs)));
  }

  // x*1, 1*x, x/1, x+0, 0+x, x-0, neg(neg(x)): the operand that stands for the node.
  // Each returns x unchanged in value for every x, NaN and infinities included; only
  // -0 + 0 = +0 differs, which no comparison or store can tell apart from -0 except by its
  // sign bit.
  std::optional<NodeId> identity_operand(const Node& n) const {
    const auto& in = n.inputs;
    switch (n.op) {
      case Op::mul:
        if (is_constant(in[1], 1.0)) return in[0];
        if (is_constant(in[0], 1.0)) return in[1];
        break;
      case Op::div:
        if (is_constant(in[1], 1.0)) return in[0];
        break;
      case Op::add:
        if (is_constant(in[1], 0.0)) return in[0];
        if (is_constant(in[0], 0.0)) return in[1];
        break;
      case Op::sub:
        if (is_constant(in[1], 0.0)) return in[0];
        break;
      case Op::neg: {
        const Node& inner = node(in[0]);
        if (inner.kind == NodeKind::compute && inner.op == Op::neg) return inner.inputs[0];
        break;
      }
      default: break;
    }
    return std::nullopt;
  }

  // (x op c1) op c2 -> x op (c1 op c2) for op in {mul, add}, operands in any order, when:
  //  - both nodes compute in the same dtype and c1 op c2 is exact in it (the new constant
  //    is not a rounded value), and both constants are finite;
  //  - mul: |c1| and |c2| lie on the same side of 1, so x*c1 overflows (or underflows) only
  //    where x*(c1*c2) does too;
  //  - add: c1 and c2 have the same sign, so x+c1 overflows only where x+(c1+c2) does too.
  // What changes is one rounding fewer: the result is the correctly rounded x op (c1 op c2).
  std::optional<NodeId> reassociate(const Node& n) {
    if (n.op != Op::mul && n.op != Op::add) return std::nullopt;
    for (int k = 0; k < 2; ++k) {
      auto c2 = constant_value(n.inputs[k]);
      const Node& inner = node(n.inputs[1 - k]);
      if (!c2 || inner.kind != NodeKind::compute || inner.op != n.op || inner.dtype != n.dtype)
        continue;
      for (int j = 0; j < 2; ++j) {
        auto c1 = constant_value(inner.inputs[j]);
        if (!c1 || !std::isfinite(*c1) || !std::isfinite(*c2)) continue;
        const double combined = n.op == Op::mul ? *c1 * *c2 : *c1 + *c2;
        if (!std::isfinite(combined) || round_to(n.dtype, combined) != combined) continue;
        const bool same_side = n.op == Op::mul
                                   ? (std::fabs(*c1) >= 1) == (std::fabs(*c2) >= 1) ||
                                         std::fabs(*c1) == 1 || std::fabs(*c2) == 1
                                   : (*c1 >= 0) == (*c2 >= 0);
        if (!same_side) continue;
        Node combined_node = n;
        combined_node.inputs = {inner.inputs[1 - j], rw_.constant(combined, n.dtype)};
        return fold(std::move(combined_node));
      }
    }
    return std::nullopt;
  }

  // x**2 -> x*x and x**3 -> (x*x)*x, computed in f32 (the node's own dtype for the last
  // product): powf with an exponent it does not know at compile time costs about a hundred
  // instructions per element, which made an epilogue with GPT-2's x**3 (its tanh-GELU spelled
  // out) five times slower than the GEMM. PyTorch computes these exponents the same way.
  // x*x is correctly rounded, (x*x)*x within about one unit in the last place of f32.
  std::optional<NodeId> small_power(const Node& n) {
    if (n.op != Op::pow) return std::nullopt;
    const auto e = constant_value(n.inputs[1]);
    if (!e || (*e != 2.0 && *e != 3.0)) return std::nullopt;
    const NodeId x = n.inputs[0];
    if (*e == 2.0) return rw_.compute(Op::mul, {x, x}, n.dtype);
    return rw_.compute(Op::mul, {rw_.compute(Op::mul, {x, x}, DType::f32), x}, n.dtype);
  }

  GraphRewriter& rw_;
};

}  // namespace

Graph fold_constants(const Graph& g, const PipelineOptions&) {
  return rewrite_graph(g, [](GraphRewriter& rw, NodeId, Node n) {
    return ConstantFolder(rw).fold(std::move(n));
  });
}

}  // namespace evtc::passes
