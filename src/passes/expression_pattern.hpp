// Expression patterns over the IR, for passes that recognise a computation by its shape
// (fold_activations). A pattern is a small tree: captures (`x`), constants matched with a
// tolerance, ops (commutative binary ops match their operands in either order), products
// (a tree of muls in any association and order, so `0.5*x*y`, `x*(y*0.5)` and `(y*x)*0.5`
// are one pattern) and alternatives.
#pragma once
#include <array>
#include <optional>
#include <vector>

#include "evtc/graph.hpp"

namespace evtc::passes {

inline constexpr int kMaxCaptures = 3;
// Constants match when |value - expected| <= kConstantTolerance * |expected|: users write
// 0.7071 for M_SQRT1_2 and f32 rounds 0.044715, but 0.8 is not 0.7071.
inline constexpr double kConstantTolerance = 1e-4;

struct Pattern {
  enum class Kind { capture, constant, any_constant, op, product, any_of };
  Kind kind = Kind::capture;
  int slot = 0;        // capture, any_constant
  double value = 0.0;  // constant
  Op op{};             // op
  std::vector<Pattern> children;  // op operands, product factors, alternatives
};

namespace pattern {
// Any node; every occurrence of one slot must be the same node.
Pattern capture(int slot);
// A constant equal to `value` within kConstantTolerance.
Pattern constant(double value);
// Any constant, bound to a slot like capture().
Pattern any_constant(int slot);
Pattern op(Op op, std::vector<Pattern> operands);
// Factors that are themselves products are flattened into this one.
Pattern product(std::vector<Pattern> factors);
// The first alternative that matches.
Pattern any_of(std::vector<Pattern> alternatives);
}  // namespace pattern

struct PatternMatch {
  std::array<std::optional<NodeId>, kMaxCaptures> captures;
  // The compute nodes the pattern covers (the root included; a node may repeat).
  std::vector<NodeId> nodes;
};

// Matches `p` rooted at node `root` of `g`. Every compute node covered must compute in the
// root's dtype (a pattern spelled in bf16 arithmetic is a different computation).
std::optional<PatternMatch> match_pattern(const Graph& g, const Pattern& p, NodeId root);

}  // namespace evtc::passes
