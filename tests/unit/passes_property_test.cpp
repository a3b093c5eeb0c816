// Property test: random epilogues, evaluated by the fp64 reference interpreter before and
// after every pass of the pipeline, give the same outputs (within one unit in the last place
// of each output's dtype: folding changes where f32 intermediates round, never what is
// computed). The generator mixes plain arithmetic with what the passes look for: constant
// subtrees and identities, commuted duplicates, decomposed activations, casts, dead code,
// and aux operands bound through broadcast views.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "evtc/ir_text.hpp"
#include "evtc/passes.hpp"
#include "evtc/reference.hpp"
#include "passes/normalize_casts.hpp"

using namespace evtc;

namespace {

constexpr int64_t kM = 3, kN = 5;

// How an aux operand's data is laid out, and the view it is bound with.
enum class ViewKind { full, row, col, scalar, col_major, unfusable };

class RandomEpilogue {
 public:
  explicit RandomEpilogue(uint64_t seed) : rng_(seed) {
    acc_ = g_.accum();
    pool_.push_back(acc_);
    add_operands();
    const int steps = uniform(6, 18);
    for (int s = 0; s < steps; ++s) grow();
    add_outputs();
    for (int64_t i = 0; i < kM * kN; ++i) acc_data_.push_back(2 * normal());
    for (int64_t i = 0; i < kM * kN; ++i) c_data_.push_back(normal());
  }

  const Graph& graph() const { return g_; }
  PipelineOptions options() const {
    PipelineOptions o;
    o.views = views_;
    o.gemm.m = known_sizes_ ? kM : 0;
    o.gemm.n = known_sizes_ ? kN : 0;
    return o;
  }

  // Inputs for `g` (the original or any rewrite of it): each operand's data in the form the
  // node that reads it expects, so an aux read as a row vector gets its n values.
  ReferenceInputs inputs_for(const Graph& g) const {
    ReferenceInputs in;
    in.m = kM;
    in.n = kN;
    in.acc = acc_data_;
    in.c = c_data_;
    for (const Node& n : g.nodes()) {
      if (!n.is_load() || n.kind == NodeKind::source || n.name.empty()) continue;
      const auto& compact = data_.at(n.name);
      in.operands[n.name] = n.kind == NodeKind::aux ? expand(n.name, compact) : compact;
    }
    return in;
  }

 private:
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool coin(double p = 0.5) { return std::bernoulli_distribution(p)(rng_); }
  double normal() { return std::normal_distribution<double>(0.0, 1.0)(rng_); }
  template <class T>
  const T& choose(const std::vector<T>& v) {
    return v[static_cast<size_t>(uniform(0, static_cast<int>(v.size()) - 1))];
  }

  std::vector<double> random_values(int64_t count) {
    std::vector<double> v;
    for (int64_t i = 0; i < count; ++i) v.push_back(normal());
    return v;
  }

  void add_operands() {
    known_sizes_ = coin();
    const DType types[] = {DType::bf16, DType::f32};
    for (int i = uniform(0, 2); i-- > 0;) {
      const std::string name = "r" + std::to_string(i);
      pool_.push_back(g_.row_vec(name, types[uniform(0, 1)]));
      data_[name] = random_values(kN);
    }
    for (int i = uniform(0, 2); i-- > 0;) {
      const std::string name = "c" + std::to_string(i);
      pool_.push_back(g_.col_vec(name, types[uniform(0, 1)]));
      data_[name] = random_values(kM);
    }
    if (coin(0.3)) {
      pool_.push_back(g_.param("alpha"));
      data_["alpha"] = random_values(1);
    }
    if (coin(0.3)) pool_.push_back(g_.source(DType::bf16));
    for (int i = uniform(0, 3); i-- > 0;) add_aux("a" + std::to_string(i), types[uniform(0, 1)]);
  }

  void add_aux(const std::string& name, DType dtype) {
    const auto kind = static_cast<ViewKind>(uniform(0, 5));
    view_kinds_[name] = kind;
    const bool shaped = coin();  // broadcasts given by a size-1 dimension rather than stride 0
    switch (kind) {
      case ViewKind::full: views_[name] = {kM, kN, kN, 1}; data_[name] = random_values(kM * kN); break;
      case ViewKind::row:
        views_[name] = shaped ? OperandView{1, kN, kN, 1} : OperandView{kM, kN, 0, 1};
        data_[name] = random_values(kN);
        break;
      case ViewKind::col:
        views_[name] = shaped ? OperandView{kM, 1, 1, 1} : OperandView{kM, kN, 1, 0};
        data_[name] = random_values(kM);
        break;
      case ViewKind::scalar:
        views_[name] = shaped ? OperandView{1, 1, 1, 1} : OperandView{kM, kN, 0, 0};
        data_[name] = random_values(1);
        break;
      case ViewKind::col_major: views_[name] = {kM, kN, 1, kM}; data_[name] = random_values(kM * kN); break;
      case ViewKind::unfusable: views_[name] = {kM, kN, 2 * kN, 1}; data_[name] = random_values(kM * kN); break;
    }
    pool_.push_back(g_.aux(name, dtype));
  }

  std::vector<double> expand(const std::string& name, const std::vector<double>& compact) const {
    std::vector<double> full(kM * kN);
    for (int64_t i = 0; i < kM; ++i)
      for (int64_t j = 0; j < kN; ++j) {
        double v = 0;
        switch (view_kinds_.at(name)) {
          case ViewKind::row: v = compact[j]; break;
          case ViewKind::col: v = compact[i]; break;
          case ViewKind::scalar: v = compact[0]; break;
          default: v = compact[i * kN + j]; break;
        }
        full[i * kN + j] = v;
      }
    return full;
  }

  // Recent values are likelier, so expressions grow deep as well as wide.
  Value pick() {
    const int last = static_cast<int>(pool_.size()) - 1;
    const int back = std::min(last, static_cast<int>(std::geometric_distribution<int>(0.4)(rng_)));
    return pool_[last - back];
  }
  Value c(double v) { return g_.constant(v); }
  Value un(Op op, Value x) { return g_.compute(op, {x}); }
  Value negated(Value x) {
    switch (uniform(0, 2)) {
      case 0: return -x;
      case 1: return c(0.0) - x;
      default: return x * c(-1.0);
    }
  }
  Value sigmoid_of(Value x) { return c(1.0) / (coin() ? c(1.0) + exp(negated(x)) : exp(negated(x)) + c(1.0)); }

  // One random step: a plain op, or a shape some pass looks for.
  void grow() {
    const Value x = pick();
    const Value y = pick();
    const double cs[] = {2.0, 3.0, 0.5, 0.25, -1.0, 1.5, 4.0};
    Value r;
    switch (uniform(0, 17)) {
      case 0: r = g_.compute(choose(std::vector<Op>{Op::add, Op::sub, Op::mul, Op::max, Op::min}), {x, y}); break;
      case 1: r = un(choose(std::vector<Op>{Op::relu, Op::sigmoid, Op::tanh, Op::neg, Op::abs, Op::silu, Op::gelu}), x); break;
      case 2: {
        switch (uniform(0, 5)) {
          case 0: r = x * c(1.0); break;
          case 1: r = c(1.0) * x; break;
          case 2: r = x + c(0.0); break;
          case 3: r = x - c(0.0); break;
          case 4: r = x / c(1.0); break;
          default: r = -(-x); break;
        }
        break;
      }
      case 3: r = coin() ? (x * c(cs[uniform(0, 6)])) * c(cs[uniform(0, 6)])
                         : (x + c(cs[uniform(0, 6)])) + c(cs[uniform(0, 6)]);
        break;
      case 4: r = x * (c(cs[uniform(0, 6)]) + c(cs[uniform(0, 6)])) + un(Op::sqrt, c(4.0)); break;
      case 5:  // silu spellings
        switch (uniform(0, 2)) {
          case 0: r = x / (c(1.0) + exp(negated(x))); break;
          case 1: r = coin() ? sigmoid(x) * x : x * sigmoid(x); break;
          default: r = x * sigmoid_of(x); break;
        }
        break;
      case 6: r = sigmoid_of(x); break;
      case 7: r = c(0.5) * x * (c(1.0) + un(Op::erf, coin() ? x * c(0.70710678) : x / c(1.41421356))); break;
      case 8: {
        const Value cube = coin() ? x * x * x : g_.compute(Op::pow, {x, c(3.0)});
        r = x * c(0.5) * (c(1.0) + tanh(c(0.7978845608) * (x + c(0.044715) * cube)));
        break;
      }
      case 9: r = x * sigmoid(c(1.702) * x); break;
      case 10: r = coin() ? max(x, c(0.0)) : max(c(0.0), x); break;
      case 11: r = coin() ? relu(x) * relu(x) : g_.compute(Op::pow, {relu(x), c(2.0)}); break;
      case 12: r = min(max(x, c(-1.5)), c(2.0)); break;
      case 13: {  // a commuted duplicate for CSE
        const Op op = choose(std::vector<Op>{Op::add, Op::mul, Op::max, Op::min});
        pool_.push_back(g_.compute(op, {x, y}));
        r = g_.compute(op, {y, x});
        break;
      }
      case 14: r = cast(x, coin() ? DType::bf16 : DType::f32); break;
      case 15: {  // a shared intermediate: sigmoid(x) used by a silu and on its own
        const Value s = sigmoid(x);
        pool_.push_back(s);
        r = x * s;
        break;
      }
      case 16: r = tanh(x) * y; break;
      default: r = (x + y) * c(0.5); break;
    }
    pool_.push_back(r);
  }

  bool reads_acc(NodeId id) const {
    const Node& n = g_.node(id);
    if (n.kind == NodeKind::accum) return true;
    for (NodeId in : n.inputs)
      if (reads_acc(in)) return true;
    return false;
  }

  void add_outputs() {
    std::vector<Value> candidates;
    for (const Value& v : pool_)
      if (v.node().shape == Shape::full && reads_acc(v.id)) candidates.push_back(v);
    const DType types[] = {DType::bf16, DType::f32, DType::f16};
    const int outputs = uniform(1, 3);
    for (int i = 0; i < outputs; ++i) {
      Value v = candidates[candidates.size() - 1 - std::min<size_t>(i, candidates.size() - 1)];
      const DType t = types[uniform(0, 2)];
      if (coin(0.2)) v = cast(v, t);
      g_.store("out" + std::to_string(i), v, t);
    }
    if (coin(0.3)) {
      const auto axis = static_cast<ReduceAxis>(uniform(0, 2));
      const auto op = choose(std::vector<ReduceOp>{ReduceOp::sum, ReduceOp::max, ReduceOp::amax});
      g_.store("red", g_.reduce(axis, op, choose(candidates)), DType::f32);
    }
  }

  std::mt19937_64 rng_;
  Graph g_;
  Value acc_;
  std::vector<Value> pool_;
  bool known_sizes_ = false;
  std::map<std::string, OperandView> views_;
  std::map<std::string, ViewKind> view_kinds_;
  std::map<std::string, std::vector<double>> data_;
  std::vector<double> acc_data_, c_data_;
};

bool all_finite(const ReferenceOutputs& outs) {
  for (const auto& [name, values] : outs)
    for (double v : values)
      if (!std::isfinite(v) || std::fabs(v) > 1e30) return false;
  return true;
}

// Folding changes where f32 intermediates round (x*sigmoid(x) rounds twice, silu once), and
// a later subtraction of nearly equal values can turn that last-bit difference into a
// large relative one. So an element passes when it is within one unit in the last place of
// its dtype, or within 1e-6 of the output's scale: a wrong rewrite (gelu for gelu_tanh, a
// dropped rounding to bf16, a wrong constant) moves values by far more than that.
std::string mismatch(const std::vector<double>& got, const std::vector<double>& want, DType dtype) {
  if (got.size() != want.size()) return "lengths differ";
  double sum_sq = 0;
  for (double w : want) sum_sq += w * w;
  const double floor = 1e-6 * (1 + std::sqrt(sum_sq / static_cast<double>(want.size())));
  const double rtol = tolerance_for(dtype).rtol;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const bool same = (std::isnan(g) && std::isnan(w)) || g == w ||
                      (std::isfinite(g) && std::isfinite(w) &&
                       std::fabs(g - w) <= rtol * std::fabs(w) + floor);
    if (!same) return "element " + std::to_string(i) + ": got " + std::to_string(g) + ", want " +
                      std::to_string(w);
  }
  return "";
}

DType output_dtype(const Graph& g, const std::string& name) {
  for (NodeId o : g.outputs())
    if (g.node(o).name == name) return g.node(o).dtype;
  ADD_FAILURE() << "no output " << name;
  return DType::f32;
}

constexpr int kGraphs = 400;

// Runs the pipeline on kGraphs random epilogues and checks, after every pass that changes the
// graph, that the outputs are those of the baseline: the input itself in eager mode; in fast and
// compile mode the input once normalize_casts has removed its roundings (which changes values on
// purpose), after which no pass may change them again.
void check_pipeline(CastMode mode) {
  int checked = 0, changed_somewhere = 0;
  // Compute results round to f32 as on the device, where a cast to f32 changes nothing.
  const ReferenceOptions device_rounding{.round_compute = true};
  for (uint64_t seed = 1; checked < kGraphs; ++seed) {
    ASSERT_LT(seed, 10u * kGraphs) << "the generator keeps producing non-finite outputs";
    const RandomEpilogue e(seed);
    const Graph& g = e.graph();
    ReferenceOutputs want = evaluate_reference(g, e.inputs_for(g), device_rounding);
    // Overflowing inputs are not the point: NaN is where relu and max(x, 0) may differ.
    if (!all_finite(want)) continue;
    ++checked;
    PipelineOptions options = e.options();
    options.cast_mode = mode;
    bool any_change = false;
    const Graph final = run_pipeline(g, options, [&](const PassInfo& pass, const Graph& after,
                                                      bool changed) {
      any_change = any_change || changed;
      const ReferenceOutputs got = evaluate_reference(after, e.inputs_for(after), device_rounding);
      if (mode != CastMode::eager && pass.name == "normalize_casts") {
        for (const Node& n : after.nodes()) {
          const bool sixteen_bit = n.dtype == DType::bf16 || n.dtype == DType::f16;
          if (mode == CastMode::fast) {
            EXPECT_NE(n.kind, NodeKind::cast) << "seed " << seed << "\n" << print(after);
            if (n.kind == NodeKind::compute) EXPECT_EQ(n.dtype, DType::f32) << "seed " << seed;
          } else {
            // compile: a 16-bit rounding only of the library GEMM's result (the accumulator,
            // with broadcast scales and offsets); no op computes in 16 bits
            if (n.kind == NodeKind::cast && sixteen_bit)
              EXPECT_TRUE(passes::library_gemm_result(after, n.inputs[0])) << "seed " << seed << "\n" << print(after);
            if (n.kind == NodeKind::compute) EXPECT_FALSE(sixteen_bit) << "seed " << seed << "\n" << print(after);
          }
        }
        want = got;
        return;
      }
      if (!changed) return;
      ASSERT_EQ(got.size(), want.size());
      for (const auto& [name, values] : want) {
        const std::string bad = mismatch(got.at(name), values, output_dtype(g, name));
        EXPECT_EQ(bad, "") << "seed " << seed << ", after " << pass.name << ", output " << name
                           << "\n--- input\n" << print(g) << "--- after\n" << print(after);
      }
    });
    changed_somewhere += any_change;
    EXPECT_EQ(print(run_pipeline(final, options)), print(final))
        << "seed " << seed << ": the pipeline is not idempotent\n" << print(g);
    if (testing::Test::HasFailure()) return;
  }
  // The generator must actually give the passes work.
  EXPECT_GT(changed_somewhere, kGraphs * 9 / 10);
}

}  // namespace

TEST(PassProperty, EagerPipelinePreservesTheReferenceOutputs) { check_pipeline(CastMode::eager); }

TEST(PassProperty, FastPipelineRoundsOnlyAtStoresAndPreservesTheRest) {
  check_pipeline(CastMode::fast);
}

TEST(PassProperty, CompilePipelineRoundsTheGemmsResultAndStoresAndPreservesTheRest) {
  check_pipeline(CastMode::compile);
}
