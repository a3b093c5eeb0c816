#include "passes/expression_pattern.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "evtc/error.hpp"

namespace evtc::passes {

namespace pattern {

Pattern capture(int slot) {
  EVTC_INTERNAL_ASSERT(slot >= 0 && slot < kMaxCaptures, "capture slot out of range");
  Pattern p;
  p.slot = slot;
  return p;
}

Pattern constant(double value) {
  Pattern p;
  p.kind = Pattern::Kind::constant;
  p.value = value;
  return p;
}

Pattern any_constant(int slot) {
  EVTC_INTERNAL_ASSERT(slot >= 0 && slot < kMaxCaptures, "capture slot out of range");
  Pattern p;
  p.kind = Pattern::Kind::any_constant;
  p.slot = slot;
  return p;
}

Pattern op(Op o, std::vector<Pattern> operands) {
  EVTC_INTERNAL_ASSERT(static_cast<int>(operands.size()) == op_info(o).arity,
                       "pattern operand count differs from the op's arity");
  Pattern p;
  p.kind = Pattern::Kind::op;
  p.op = o;
  p.children = std::move(operands);
  return p;
}

Pattern product(std::vector<Pattern> factors) {
  Pattern p;
  p.kind = Pattern::Kind::product;
  for (Pattern& f : factors) {
    if (f.kind == Pattern::Kind::product)
      for (Pattern& inner : f.children) p.children.push_back(std::move(inner));
    else
      p.children.push_back(std::move(f));
  }
  EVTC_INTERNAL_ASSERT(p.children.size() >= 2, "a product needs two factors");
  return p;
}

Pattern any_of(std::vector<Pattern> alternatives) {
  Pattern p;
  p.kind = Pattern::Kind::any_of;
  p.children = std::move(alternatives);
  return p;
}

}  // namespace pattern

namespace {

// One way of reading a mul tree as a product: its factors and the muls that were opened.
struct Factoring {
  std::vector<NodeId> factors;
  std::vector<NodeId> muls;
};

class Matcher {
 public:
  Matcher(const Graph& g, DType dtype) : g_(g), dtype_(dtype) {}

  bool match(const Pattern& p, NodeId id) {
    const Node& n = g_.node(id);
    switch (p.kind) {
      case Pattern::Kind::capture: return bind(p.slot, id);
      case Pattern::Kind::constant:
        return is_constant(n) && std::fabs(n.value - p.value) <= kConstantTolerance * std::fabs(p.value);
      case Pattern::Kind::any_constant: return is_constant(n) && bind(p.slot, id);
      case Pattern::Kind::op: return match_op(p, id);
      case Pattern::Kind::product: return match_product(p, id);
      case Pattern::Kind::any_of:
        for (const Pattern& alt : p.children) {
          const State s = save();
          if (match(alt, id)) return true;
          restore(s);
        }
        return false;
    }
    return false;
  }

  PatternMatch result() const { return match_; }

 private:
  struct State {
    std::array<std::optional<NodeId>, kMaxCaptures> captures;
    size_t nodes;
  };
  State save() const { return {match_.captures, match_.nodes.size()}; }
  void restore(const State& s) {
    match_.captures = s.captures;
    match_.nodes.resize(s.nodes);
  }

  static bool is_constant(const Node& n) {
    return n.kind == NodeKind::scalar && n.scalar_kind == ScalarKind::constant;
  }
  bool is_compute(const Node& n, Op op) const {
    return n.kind == NodeKind::compute && n.op == op && n.dtype == dtype_;
  }

  bool bind(int slot, NodeId id) {
    auto& c = match_.captures[slot];
    if (c) return *c == id;
    c = id;
    return true;
  }

  bool match_operands(const Pattern& p, const std::vector<NodeId>& inputs,
                      std::span<const size_t> order) {
    for (size_t k = 0; k < order.size(); ++k)
      if (!match(p.children[k], inputs[order[k]])) return false;
    return true;
  }

  bool match_op(const Pattern& p, NodeId id) {
    const Node& n = g_.node(id);
    if (!is_compute(n, p.op)) return false;
    const State s = save();
    match_.nodes.push_back(id);
    static constexpr size_t kInOrder[] = {0, 1, 2};
    static constexpr size_t kSwapped[] = {1, 0};
    if (match_operands(p, n.inputs, std::span(kInOrder, n.inputs.size()))) return true;
    restore(s);
    if (op_info(p.op).commutative && n.inputs.size() == 2) {
      match_.nodes.push_back(id);
      if (match_operands(p, n.inputs, kSwapped)) return true;
      restore(s);
    }
    return false;
  }

  // Every factoring of the mul tree at `id` into at most `max` factors; `id` is opened when
  // `open` (the root of a product pattern must be a mul), else it may also be one factor.
  void factorings(NodeId id, size_t max, bool open, std::vector<Factoring>& out) const {
    if (!open) out.push_back({{id}, {}});
    const Node& n = g_.node(id);
    if (!is_compute(n, Op::mul) || max < 2) return;
    std::vector<Factoring> left, right;
    factorings(n.inputs[0], max - 1, false, left);
    factorings(n.inputs[1], max - 1, false, right);
    for (const Factoring& l : left)
      for (const Factoring& r : right) {
        if (l.factors.size() + r.factors.size() > max) continue;
        Factoring f{l.factors, {id}};
        f.factors.insert(f.factors.end(), r.factors.begin(), r.factors.end());
        f.muls.insert(f.muls.end(), l.muls.begin(), l.muls.end());
        f.muls.insert(f.muls.end(), r.muls.begin(), r.muls.end());
        out.push_back(std::move(f));
      }
  }

  bool match_product(const Pattern& p, NodeId id) {
    const size_t k = p.children.size();
    std::vector<Factoring> all;
    factorings(id, k, true, all);
    for (const Factoring& f : all) {
      if (f.factors.size() != k) continue;
      std::vector<size_t> order(k);
      std::iota(order.begin(), order.end(), 0);
      do {
        const State s = save();
        match_.nodes.insert(match_.nodes.end(), f.muls.begin(), f.muls.end());
        if (match_operands(p, f.factors, order)) return true;
        restore(s);
      } while (std::next_permutation(order.begin(), order.end()));
    }
    return false;
  }

  const Graph& g_;
  DType dtype_;
  PatternMatch match_;
};

}  // namespace

std::optional<PatternMatch> match_pattern(const Graph& g, const Pattern& p, NodeId root) {
  Matcher m(g, g.node(root).dtype);
  if (!m.match(p, root)) return std::nullopt;
  return m.result();
}

}  // namespace evtc::passes
