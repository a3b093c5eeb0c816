#include "passes/fold_activations.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "evtc/error.hpp"
#include "passes/eliminate_common_subexpressions.hpp"
#include "passes/expression_pattern.hpp"
#include "passes/graph_rewriter.hpp"

namespace evtc::passes {
namespace {

using namespace pattern;

constexpr double kSqrt2OverPi = 0.79788456080286535587989211986876;
constexpr double kSqrt2 = 1.41421356237309504880168872420969808;
constexpr double kGeluTanhCubic = 0.044715;
constexpr double kQuickGeluScale = 1.702;

// Capture slots: x is the activation's operand; lo and hi are clamp bounds.
const Pattern x = capture(0);
constexpr int kLo = 1, kHi = 2;

Pattern c(double v) { return constant(v); }

// k*x (k = 1: x itself).
Pattern scaled_x(double k) { return k == 1.0 ? x : product({c(k), x}); }
// -(k*x) in its usual spellings: neg(k*x), 0 - k*x, (-k)*x, k*neg(x).
Pattern negated_scaled_x(double k) {
  const Pattern kx = scaled_x(k);
  std::vector<Pattern> alts = {op(Op::neg, {kx}), op(Op::sub, {c(0), kx}), product({c(-k), x})};
  if (k != 1.0) alts.push_back(product({c(k), op(Op::neg, {x})}));
  return any_of(std::move(alts));
}
Pattern one_plus_exp_neg(double k) {
  return op(Op::add, {c(1), op(Op::exp, {negated_scaled_x(k)})});
}
// 1/(1+exp(-k*x)) without the native sigmoid.
Pattern decomposed_sigmoid(double k) {
  return any_of({op(Op::div, {c(1), one_plus_exp_neg(k)}),
                 op(Op::reciprocal, {one_plus_exp_neg(k)})});
}
Pattern any_sigmoid(double k) {
  return any_of({op(Op::sigmoid, {scaled_x(k)}), decomposed_sigmoid(k)});
}
// x*sigmoid(k*x), x/(1+exp(-k*x)).
Pattern x_times_sigmoid(double k) {
  return any_of({product({x, any_sigmoid(k)}), op(Op::div, {x, one_plus_exp_neg(k)})});
}
// 0.5*x*p, x*p/2, (x/2)*p.
Pattern half_x_times(const Pattern& p) {
  return any_of({product({c(0.5), x, p}), op(Op::div, {product({x, p}), c(2)}),
                 product({op(Op::div, {x, c(2)}), p})});
}
Pattern gelu_erf() {
  const Pattern arg = any_of({product({x, c(1 / kSqrt2)}), op(Op::div, {x, c(kSqrt2)})});
  return half_x_times(op(Op::add, {c(1), op(Op::erf, {arg})}));
}
Pattern gelu_tanh() {
  const Pattern cubic = any_of({product({c(kGeluTanhCubic), x, x, x}),
                                product({c(kGeluTanhCubic), op(Op::pow, {x, c(3)})})});
  const Pattern arg = product({c(kSqrt2OverPi), op(Op::add, {x, cubic})});
  return half_x_times(op(Op::add, {c(1), op(Op::tanh, {arg})}));
}
Pattern relu_square() {
  const Pattern r = op(Op::relu, {x});
  return any_of({product({r, r}), op(Op::pow, {r, c(2)}), op(Op::square, {r})});
}
Pattern min_max_clamp() {
  return any_of({op(Op::min, {op(Op::max, {x, any_constant(kLo)}), any_constant(kHi)}),
                 op(Op::max, {op(Op::min, {x, any_constant(kHi)}), any_constant(kLo)})});
}

bool bounds_ordered(const Graph& g, const PatternMatch& m) {
  return g.node(*m.captures[kLo]).value <= g.node(*m.captures[kHi]).value;
}

struct ActivationRule {
  std::string_view spelling;
  Op native;
  std::vector<int> operand_slots;  // captures passed to the native op, in order
  Pattern pattern;
  bool (*accept)(const Graph&, const PatternMatch&) = nullptr;
};

// The activation table: adding a pattern is adding one entry. The first entry that matches
// a node wins, so an entry comes before any entry that matches a part of it (clamp before
// relu: min(max(x,0),6) is a clamp, not a min over a relu).
const std::vector<ActivationRule>& activation_table() {
  static const std::vector<ActivationRule> kActivationRules = {
      {"min(max(x, lo), hi), lo <= hi", Op::clamp, {0, kLo, kHi}, min_max_clamp(),
       bounds_ordered},
      {"relu(x)*relu(x), relu(x)**2", Op::relu_square, {0}, relu_square()},
      {"0.5*x*(1+erf(x/sqrt(2)))", Op::gelu, {0}, gelu_erf()},
      {"0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3)))", Op::gelu_tanh, {0}, gelu_tanh()},
      {"x*sigmoid(1.702*x)", Op::quick_gelu, {0}, x_times_sigmoid(kQuickGeluScale)},
      {"x*sigmoid(x), x/(1+exp(-x))", Op::silu, {0}, x_times_sigmoid(1.0)},
      {"1/(1+exp(-x))", Op::sigmoid, {0}, decomposed_sigmoid(1.0)},
      {"max(x, 0)", Op::relu, {0}, op(Op::max, {x, c(0)})},
  };
  return kActivationRules;
}

struct Fold {
  const ActivationRule* rule;
  PatternMatch match;
};

// True when every node the match covers, except its root, is used only inside the match.
bool is_private(NodeId root, const PatternMatch& m,
                const std::vector<std::vector<NodeId>>& users) {
  for (NodeId id : m.nodes) {
    if (id == root) continue;
    for (NodeId u : users[id])
      if (std::find(m.nodes.begin(), m.nodes.end(), u) == m.nodes.end()) return false;
  }
  return true;
}

// Non-overlapping folds, outermost first: nodes are visited from the last (a user) to the
// first, and the nodes a fold covers are not considered again.
std::map<NodeId, Fold> find_folds(const Graph& g) {
  const auto users = g.users();
  std::vector<bool> covered(g.size(), false);
  std::map<NodeId, Fold> folds;
  for (NodeId id = static_cast<NodeId>(g.size()); id-- > 0;) {
    // Only f32 arithmetic: a decomposition computed in bf16 or f16 rounds coarsely at every
    // step, and those roundings are part of what the user wrote (CastMode::eager).
    const Node& n = g.node(id);
    if (covered[id] || n.kind != NodeKind::compute || n.dtype != DType::f32) continue;
    for (const ActivationRule& rule : activation_table()) {
      auto m = match_pattern(g, rule.pattern, id);
      if (!m || !is_private(id, *m, users) || (rule.accept && !rule.accept(g, *m))) continue;
      for (NodeId n : m->nodes) covered[n] = true;
      folds.emplace(id, Fold{&rule, std::move(*m)});
      break;
    }
  }
  return folds;
}

}  // namespace

std::vector<ActivationRuleInfo> activation_rules() {
  std::vector<ActivationRuleInfo> out;
  for (const ActivationRule& r : activation_table()) out.push_back({r.spelling, r.native});
  return out;
}

Graph fold_activations(const Graph& g, const PipelineOptions& options) {
  // Repeats until nothing matches, since one fold can complete another pattern
  // (max(x,0) -> relu makes relu(x)*relu(x) a relu_square). Every fold removes at least one
  // node or turns a max into a relu that no entry matches again, so this terminates.
  Graph current = g;
  for (size_t round = 0;; ++round) {
    EVTC_INTERNAL_ASSERT(round <= g.size(), "fold_activations does not converge");
    const auto folds = find_folds(current);
    if (folds.empty()) return current;
    const Graph folded = rewrite_graph(current, [&](GraphRewriter& rw, NodeId id, Node n) {
      auto it = folds.find(id);
      if (it == folds.end()) return rw.add(std::move(n));
      const Fold& f = it->second;
      std::vector<NodeId> operands;
      for (int slot : f.rule->operand_slots) operands.push_back(rw.image(*f.match.captures[slot]));
      return rw.compute(f.rule->native, std::move(operands), n.dtype);
    });
    // Two spellings of one activation over the same x fold to two equal nodes: merge them,
    // so the output holds each value once (as CSE left the input) and the next round's
    // patterns see one x.
    current = eliminate_common_subexpressions(folded, options);
  }
}

}  // namespace evtc::passes
