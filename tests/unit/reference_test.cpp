#include <gtest/gtest.h>

#include <set>

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>

#include <sys/wait.h>

#include "evtc/error.hpp"
#include "evtc/graph.hpp"
#include "evtc/expression.hpp"
#include "evtc/reference.hpp"
#include "evtc/runtime.hpp"
#include "testing/harness.hpp"

using namespace evtc;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

ReferenceInputs with_acc(int64_t m, int64_t n, std::vector<double> acc) {
  ReferenceInputs in;
  in.m = m;
  in.n = n;
  in.acc = std::move(acc);
  return in;
}

// The 2×3×2 problem computed by hand in the tests below:
//   A = [1 2; 3 4], B = [1 0 -1; 2 1 0.5]  ->  acc = A@B = [5 2 0; 11 4 -1]
ReferenceInputs hand_problem() {
  ReferenceInputs in;
  in.m = 2;
  in.n = 3;
  in.k = 2;
  in.a = {1, 2, 3, 4};
  in.b = {1, 0, -1, 2, 1, 0.5};
  in.c = {1, 1, 1, 2, 2, 2};
  in.operands["bias"] = {0.5, -1, 2};
  in.operands["scale"] = {2, -0.5};
  in.operands["alpha"] = {0.25};
  in.operands["res"] = {1, 2, 3, 4, 5, 6};
  return in;
}

std::string error_of(const Graph& g, const ReferenceInputs& in) {
  try {
    evaluate_reference(g, in);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

// --- every node kind, by hand -----------------------------------------------------------

TEST(ReferenceInterpreter, HandComputedEveryNodeKind) {
  Graph g;
  auto acc = g.accum();
  auto x = (acc * g.col_vec("scale", DType::f32) + g.row_vec("bias", DType::bf16)) *
               g.param("alpha") +
           g.source(DType::bf16) + g.aux("res", DType::bf16) + 1.0;
  g.store("D", x, DType::f32);
  g.store("D8", cast(x, DType::f8e4m3), DType::f32);
  g.store("rows", g.reduce(ReduceAxis::row, ReduceOp::sum, acc), DType::f32);
  const ReferenceOutputs out = evaluate_reference(g, hand_problem());
  // acc*scale = [10 4 0; -5.5 -2 0.5]; +bias = [10.5 3 2; -5 -3 2.5]; *0.25 =
  // [2.625 0.75 0.5; -1.25 -0.75 0.625]; +C = [3.625 1.75 1.5; 0.75 1.25 2.625];
  // +res = [4.625 3.75 4.5; 4.75 6.25 8.625]; +1:
  EXPECT_EQ(out.at("D"), (std::vector<double>{5.625, 4.75, 5.5, 5.75, 7.25, 9.625}));
  // e4m3 keeps 3 mantissa bits: 5.625 -> 5.5; 4.75 is a tie between 4.5 and 5 -> 5 (even);
  // 5.75 a tie between 5.5 and 6 -> 6 (even); 7.25 a tie -> 7 (even); 9.625 -> 10.
  EXPECT_EQ(out.at("D8"), (std::vector<double>{5.5, 5.0, 5.5, 6.0, 7.0, 10.0}));
  EXPECT_EQ(out.at("rows"), (std::vector<double>{7, 14}));
}

// m and n are each element's row and column; an integer operand is read as its value. The
// hand problem's acc = [5 2 0; 11 4 -1], labels t = [2, 0] (row 0's target column is 2, row 1's
// is 0).
TEST(ReferenceInterpreter, IndexLeavesAndIntegerOperandsByHand) {
  Graph g;
  auto acc = g.accum();
  auto m = g.index(IndexAxis::m), n = g.index(IndexAxis::n);
  auto t = g.col_vec("t", DType::i32);
  auto hit = g.compute(Op::eq, {n, t});
  g.store("target", g.reduce(ReduceAxis::row, ReduceOp::sum, g.compute(Op::where, {hit, acc, g.constant(0)})),
          DType::f32);
  g.store("grad", (acc - hit) * 2.0, DType::f32);
  g.store("D", acc * g.compute(Op::ge, {m, n}) + 10.0 * m + n, DType::f32);
  ReferenceInputs in = hand_problem();
  in.operands["t"] = {2, 0};
  const ReferenceOutputs out = evaluate_reference(g, in);
  EXPECT_EQ(out.at("target"), (std::vector<double>{0, 11}));                   // acc[0][2], acc[1][0]
  EXPECT_EQ(out.at("grad"), (std::vector<double>{10, 4, -2, 20, 8, -2}));       // (acc - onehot) * 2
  // acc * (m >= n) = [5 0 0; 11 4 0]; + 10m + n = [0 1 2; 10 11 12]:
  EXPECT_EQ(out.at("D"), (std::vector<double>{5, 1, 2, 21, 15, 12}));
}

// An integer operand holds integers of its type: a value given as a non-integer reads as the
// nearest integer, as an int32 buffer would hold it, and every value enters f32 arithmetic.
TEST(ReferenceInterpreter, IntegerOperandsReadAsTheirIntegerValue) {
  Graph g;
  g.store("D", g.accum() + g.row_vec("q", DType::i64), DType::f32);
  ReferenceInputs in = with_acc(1, 3, {0, 0, 0});
  in.operands["q"] = {2.4, -3.5, 16777217};  // 16777217 = 2^24 + 1 has no f32: reads as 2^24
  EXPECT_EQ(evaluate_reference(g, in).at("D"), (std::vector<double>{2, -4, 16777216}));
}

TEST(ReferenceInterpreter, UsesAGivenAccumulatorInsteadOfAB) {
  Graph g;
  g.store("D", g.accum() * 2.0, DType::f32);
  const ReferenceOutputs out = evaluate_reference(g, with_acc(1, 2, {1.5, -3}));
  EXPECT_EQ(out.at("D"), (std::vector<double>{3, -6}));
}

TEST(ReferenceInterpreter, RoundsLoadsToTheirDtype) {
  Graph g;
  g.store("D", g.accum() + g.row_vec("bias", DType::bf16) + g.source(DType::f16), DType::f32);
  ReferenceInputs in = with_acc(1, 1, {0});
  in.operands["bias"] = {1.0 + std::ldexp(1.0, -9)};  // not a bf16 value: reads as 1
  in.c = {std::ldexp(1.0, -30)};                      // below f16's range: reads as 0
  EXPECT_EQ(evaluate_reference(g, in).at("D"), (std::vector<double>{1.0}));
}

TEST(ReferenceInterpreter, RoundComputeRoundsEveryComputeResultToF32) {
  Graph g;
  auto acc = g.accum();
  g.store("D", (acc + std::ldexp(1.0, -30)) - acc, DType::f32);
  const ReferenceInputs in = with_acc(1, 1, {1.0});
  EXPECT_EQ(evaluate_reference(g, in).at("D"), (std::vector<double>{std::ldexp(1.0, -30)}));
  ReferenceOptions rounding;
  rounding.round_compute = true;
  EXPECT_EQ(evaluate_reference(g, in, rounding).at("D"), (std::vector<double>{0.0}));
}

TEST(ReferenceInterpreter, EvaluatesOnlyWhatReachesAnOutput) {
  Graph g;
  auto acc = g.accum();
  (void)(acc + g.row_vec("unused", DType::bf16));  // no output reads it: need not be given
  g.store("D", acc, DType::f32);
  ReferenceInputs in = with_acc(1, 1, {2});
  in.operands["not_in_graph"] = {1, 2, 3};  // ignored
  EXPECT_EQ(evaluate_reference(g, in).at("D"), (std::vector<double>{2}));
}

TEST(ReferenceInterpreter, SharedValueFeedsSeveralOutputs) {
  Graph g;
  auto f = g.accum() + g.row_vec("bias", DType::f32);
  g.store("pre", f, DType::f32);
  g.store("D", relu(f), DType::f32);
  g.store("sq", f * f, DType::f32);
  ReferenceInputs in = with_acc(1, 2, {1, -4});
  in.operands["bias"] = {1, 1};
  const ReferenceOutputs out = evaluate_reference(g, in);
  EXPECT_EQ(out.at("pre"), (std::vector<double>{2, -3}));
  EXPECT_EQ(out.at("D"), (std::vector<double>{2, 0}));
  EXPECT_EQ(out.at("sq"), (std::vector<double>{4, 9}));
}

// --- every op of the op table -----------------------------------------------------------

namespace {
struct OpCase {
  std::vector<double> args;
  std::vector<double> attrs;
  double expected;  // computed by hand (or with an independent calculator)
};

const std::multimap<std::string, OpCase>& op_cases() {
  static const std::multimap<std::string, OpCase> cases = {
      {"relu", {{-2}, {}, 0}},
      {"relu", {{3}, {}, 3}},
      {"relu_square", {{3}, {}, 9}},
      {"relu_square", {{-3}, {}, 0}},
      {"sigmoid", {{1}, {}, 0.7310585786300049}},
      {"silu", {{2}, {}, 1.7615941559557646}},
      {"gelu", {{1}, {}, 0.8413447460685429}},
      {"gelu_tanh", {{1}, {}, 0.8411919906082768}},
      {"quick_gelu", {{1}, {}, 0.8457957659328212}},
      {"tanh", {{0.5}, {}, 0.46211715726000974}},
      {"exp", {{1}, {}, 2.718281828459045}},
      {"log", {{2}, {}, 0.6931471805599453}},
      {"log", {{-1}, {}, kNaN}},
      {"neg", {{3}, {}, -3}},
      {"abs", {{-2.5}, {}, 2.5}},
      {"sqrt", {{2}, {}, 1.4142135623730951}},
      {"rsqrt", {{4}, {}, 0.5}},
      {"square", {{-3}, {}, 9}},
      {"reciprocal", {{4}, {}, 0.25}},
      {"erf", {{0.5}, {}, 0.5204998778130465}},
      {"softplus", {{1}, {}, 1.3132616875182228}},
      {"hardswish", {{1}, {}, 4.0 / 6.0}},
      {"hardswish", {{-4}, {}, 0}},
      {"mish", {{1}, {}, 0.8650983882673103}},
      {"leaky_relu", {{-2}, {0.1}, -0.2}},
      {"leaky_relu", {{-2}, {}, -0.02}},  // default alpha 0.01
      {"leaky_relu", {{3}, {0.1}, 3}},
      {"add", {{2, 3}, {}, 5}},
      {"sub", {{2, 3}, {}, -1}},
      {"mul", {{2, 3}, {}, 6}},
      {"div", {{3, 4}, {}, 0.75}},
      {"max", {{2, 3}, {}, 3}},
      {"max", {{kNaN, 3}, {}, kNaN}},
      {"min", {{2, 3}, {}, 2}},
      {"pow", {{2, 3}, {}, 8}},
      {"eq", {{2, 2}, {}, 1}},
      {"eq", {{kNaN, kNaN}, {}, 0}},
      {"ne", {{2, 3}, {}, 1}},
      {"ne", {{kNaN, kNaN}, {}, 1}},
      {"lt", {{2, 3}, {}, 1}},
      {"lt", {{3, 3}, {}, 0}},
      {"le", {{3, 3}, {}, 1}},
      {"le", {{kNaN, 3}, {}, 0}},
      {"gt", {{-0.0, 0}, {}, 0}},
      {"gt", {{1, 0}, {}, 1}},
      {"ge", {{-0.0, 0}, {}, 1}},
      {"ge", {{2, 3}, {}, 0}},
      {"clamp", {{5, 0, 4}, {}, 4}},
      {"clamp", {{-1, 0, 4}, {}, 0}},
      {"clamp", {{2, 0, 4}, {}, 2}},
      {"where", {{0, 2, 3}, {}, 3}},
      {"where", {{1, 2, 3}, {}, 2}},
      {"fma", {{2, 3, 4}, {}, 10}},
  };
  return cases;
}
}  // namespace

TEST(ReferenceOps, EveryOpOfTheTableMatchesAHandValue) {
  for (const OpInfo& info : op_table()) {
    const auto [first, last] = op_cases().equal_range(std::string(info.name));
    EXPECT_NE(first, last) << "no hand-computed case for op '" << info.name << "'";
    for (auto it = first; it != last; ++it) {
      const OpCase& c = it->second;
      SCOPED_TRACE(::testing::Message() << info.name << " case " << std::distance(first, it));
      ASSERT_EQ(static_cast<int>(c.args.size()), info.arity);
      // The first argument is the accumulator (a 1×1 [m,n] value), the others scalar params.
      Graph g;
      std::vector<Value> args{g.accum()};
      ReferenceInputs in = with_acc(1, 1, {c.args[0]});
      for (size_t a = 1; a < c.args.size(); ++a) {
        const std::string name = "p" + std::to_string(a);
        args.push_back(g.param(name));
        in.operands[name] = {c.args[a]};
      }
      g.store("D", g.compute(info.op, args, c.attrs), DType::f32);
      const double got = evaluate_reference(g, in).at("D").at(0);
      if (std::isnan(c.expected)) {
        EXPECT_TRUE(std::isnan(got)) << got;
      } else {
        // The store rounds to f32: allow its half ulp.
        EXPECT_NEAR(got, c.expected, std::ldexp(std::fabs(c.expected), -24));
      }
    }
  }
}

// --- broadcasting ------------------------------------------------------------------------

TEST(ReferenceInterpreter, BroadcastsRowAndColumnVectorsAndScalars) {
  Graph g;
  auto row = g.row_vec("r", DType::f32);
  auto col = g.col_vec("c", DType::f32);
  auto s = g.param("s");
  g.store("outer", row + col, DType::f32);             // [n] + [m] -> [m,n]
  g.store("scaled", g.accum() + row * s, DType::f32);  // scalar*[n] is [n], then + [m,n]
  g.store("cols", g.accum() - col * 2.0, DType::f32);  // [m] broadcast over n
  ReferenceInputs in = with_acc(2, 3, {1, 2, 3, 4, 5, 6});
  in.operands["r"] = {10, 20, 30};
  in.operands["c"] = {100, 200};
  in.operands["s"] = {0.5};
  const ReferenceOutputs out = evaluate_reference(g, in);
  EXPECT_EQ(out.at("outer"), (std::vector<double>{110, 120, 130, 210, 220, 230}));
  EXPECT_EQ(out.at("scaled"), (std::vector<double>{6, 12, 18, 9, 15, 21}));
  EXPECT_EQ(out.at("cols"), (std::vector<double>{-199, -198, -197, -396, -395, -394}));
}

// --- reductions --------------------------------------------------------------------------

TEST(ReferenceReduce, EveryAxisAndOp) {
  // acc = [1 -5 3; 4 2 -6]
  const std::map<std::pair<ReduceAxis, ReduceOp>, std::vector<double>> expected = {
      {{ReduceAxis::row, ReduceOp::sum}, {-1, 0}},
      {{ReduceAxis::row, ReduceOp::max}, {3, 4}},
      {{ReduceAxis::row, ReduceOp::min}, {-5, -6}},
      {{ReduceAxis::row, ReduceOp::amax}, {5, 6}},
      {{ReduceAxis::col, ReduceOp::sum}, {5, -3, -3}},
      {{ReduceAxis::col, ReduceOp::max}, {4, 2, 3}},
      {{ReduceAxis::col, ReduceOp::min}, {1, -5, -6}},
      {{ReduceAxis::col, ReduceOp::amax}, {4, 5, 6}},
      {{ReduceAxis::all, ReduceOp::sum}, {-1}},
      {{ReduceAxis::all, ReduceOp::max}, {4}},
      {{ReduceAxis::all, ReduceOp::min}, {-6}},
      {{ReduceAxis::all, ReduceOp::amax}, {6}},
  };
  for (const auto& [key, want] : expected) {
    const auto [axis, op] = key;
    SCOPED_TRACE(::testing::Message() << reduce_axis_name(axis) << "_" << reduce_op_name(op));
    Graph g;
    g.store("r", g.reduce(axis, op, g.accum()), DType::f32);
    EXPECT_EQ(evaluate_reference(g, with_acc(2, 3, {1, -5, 3, 4, 2, -6})).at("r"), want);
  }
}

// Outputs as computed in fp64, not rounded to their dtype.
ReferenceOptions unrounded() {
  ReferenceOptions o;
  o.unrounded_outputs = true;
  return o;
}

TEST(ReferenceReduce, LogSumExpOfEveryAxis) {
  // acc = [1 -5 3; 4 2 -6]
  auto lse = [](std::initializer_list<double> xs) {
    double s = 0;
    for (double x : xs) s += std::exp(x);
    return std::log(s);
  };
  Graph g;
  auto acc = g.accum();
  g.store("rows", g.reduce(ReduceAxis::row, ReduceOp::logsumexp, acc), DType::f32);
  g.store("cols", g.reduce(ReduceAxis::col, ReduceOp::logsumexp, acc), DType::f32);
  g.store("all", g.reduce(ReduceAxis::all, ReduceOp::logsumexp, acc), DType::f32);
  const ReferenceOutputs out = evaluate_reference(g, with_acc(2, 3, {1, -5, 3, 4, 2, -6}), unrounded());
  const std::vector<double> rows{lse({1, -5, 3}), lse({4, 2, -6})};
  const std::vector<double> cols{lse({1, 4}), lse({-5, 2}), lse({3, -6})};
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(out.at("rows")[i], rows[i], 1e-14);
  for (size_t j = 0; j < 3; ++j) EXPECT_NEAR(out.at("cols")[j], cols[j], 1e-14);
  EXPECT_NEAR(out.at("all")[0], lse({1, -5, 3, 4, 2, -6}), 1e-14);
}

TEST(ReferenceReduce, LogSumExpNeitherOverflowsNorUnderflows) {
  // exp(1000) overflows fp64 and exp(-1000) is 0: the fold works relative to the larger value.
  Graph g;
  g.store("rows", g.reduce(ReduceAxis::row, ReduceOp::logsumexp, g.accum()), DType::f32);
  const ReferenceOutputs out =
      evaluate_reference(g, with_acc(3, 2, {1000, 1000, -1000, -1000, -kInf, 7}), unrounded());
  EXPECT_NEAR(out.at("rows")[0], 1000 + std::log(2.0), 1e-12);
  EXPECT_NEAR(out.at("rows")[1], -1000 + std::log(2.0), 1e-12);
  EXPECT_EQ(out.at("rows")[2], 7.0);  // e^-inf adds nothing
}

TEST(ReferenceReduce, LogSumExpOfInfinities) {
  Graph g;
  g.store("rows", g.reduce(ReduceAxis::row, ReduceOp::logsumexp, g.accum()), DType::f32);
  const ReferenceOutputs out = evaluate_reference(g, with_acc(3, 2, {-kInf, -kInf, kInf, 3, kInf, -kInf}));
  EXPECT_EQ(out.at("rows")[0], -kInf);  // log of a sum of zeros
  EXPECT_EQ(out.at("rows")[1], kInf);
  EXPECT_EQ(out.at("rows")[2], kInf);
}

TEST(ReferenceReduce, NaNPropagatesThroughEveryOp) {
  for (const ReduceOpInfo& info : reduce_op_table()) {
    const ReduceOp op = info.op;
    SCOPED_TRACE(reduce_op_name(op));
    Graph g;
    auto acc = g.accum();
    g.store("rows", g.reduce(ReduceAxis::row, op, acc), DType::f32);
    g.store("cols", g.reduce(ReduceAxis::col, op, acc), DType::f32);
    g.store("all", g.reduce(ReduceAxis::all, op, acc), DType::f32);
    // NaN at (0, 1), after and before finite values in its row and column.
    const ReferenceOutputs out = evaluate_reference(g, with_acc(2, 3, {1, kNaN, 3, 4, 2, -6}));
    EXPECT_TRUE(std::isnan(out.at("rows")[0]));
    EXPECT_FALSE(std::isnan(out.at("rows")[1]));
    EXPECT_FALSE(std::isnan(out.at("cols")[0]));
    EXPECT_TRUE(std::isnan(out.at("cols")[1]));
    EXPECT_FALSE(std::isnan(out.at("cols")[2]));
    EXPECT_TRUE(std::isnan(out.at("all")[0]));
  }
}

TEST(ReferenceReduce, SumsInFp64AndRoundsOnlyAtTheStore) {
  // 1 + 2^-30 - 1 in f32 steps would be 0; in fp64 it is 2^-30.
  Graph g;
  g.store("s", g.reduce(ReduceAxis::all, ReduceOp::sum, g.accum()), DType::f32);
  g.store("s16", g.reduce(ReduceAxis::all, ReduceOp::sum, g.accum()), DType::bf16);
  const ReferenceOutputs out =
      evaluate_reference(g, with_acc(1, 3, {1.0, std::ldexp(1.0, -30), -1.0}));
  EXPECT_EQ(out.at("s"), (std::vector<double>{std::ldexp(1.0, -30)}));
  EXPECT_EQ(out.at("s16"), (std::vector<double>{std::ldexp(1.0, -30)}));
}

// --- casts and stores --------------------------------------------------------------------

TEST(ReferenceCast, RoundsToTheTargetDtype) {
  const double u8 = std::ldexp(1.0, -8), u11 = std::ldexp(1.0, -11);
  const struct {
    DType dtype;
    double in, out;
  } cases[] = {
      {DType::bf16, 1.0 + u8, 1.0},                     // tie -> even
      {DType::bf16, 1.0 + 3 * u8, 1.0 + 4 * u8},        // tie -> even (up)
      {DType::bf16, 1.0 + 1.5 * u8, 1.0 + 2 * u8},      // above half -> up
      {DType::f16, 1.0 + u11, 1.0},                     // tie -> even
      {DType::f16, 1.0 + 3 * u11, 1.0 + 4 * u11},       // tie -> even (up)
      {DType::f16, 70000.0, kInf},                      // f16 overflows to infinity
      {DType::f8e4m3, 1000.0, 448.0},                   // fp8 saturates
      {DType::f8e4m3, -1000.0, -448.0},
      {DType::f8e4m3, 0.3, 0.3125},
      {DType::f8e5m2, 1e6, 57344.0},
      {DType::f32, 1.0 + std::ldexp(1.0, -30), 1.0},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << dtype_name(c.dtype) << " " << c.in);
    Graph g;
    g.store("D", cast(g.accum(), c.dtype), DType::f32);
    EXPECT_EQ(evaluate_reference(g, with_acc(1, 1, {c.in})).at("D"), (std::vector<double>{c.out}));
  }
}

TEST(ReferenceCast, IsRoundedOnceAndComputeAfterItIsExact) {
  // cast to bf16, then add in f32 without rounding: (1 + 2^-8 -> 1) + 2^-20.
  Graph g;
  g.store("D", cast(g.accum(), DType::bf16) + std::ldexp(1.0, -20), DType::f32);
  EXPECT_EQ(evaluate_reference(g, with_acc(1, 1, {1.0 + std::ldexp(1.0, -8)})).at("D"),
            (std::vector<double>{1.0 + std::ldexp(1.0, -20)}));
}

TEST(ReferenceStore, RoundsToTheStoreDtype) {
  Graph g;
  auto acc = g.accum();
  g.store("b", acc, DType::bf16);
  g.store("h", acc, DType::f16);
  g.store("e4", acc, DType::f8e4m3);
  g.store("e5", acc, DType::f8e5m2);
  const double x = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -20);  // just above a bf16 tie
  const ReferenceOutputs out = evaluate_reference(g, with_acc(1, 3, {x, 70000.0, -1000.0}));
  EXPECT_EQ(out.at("b"), (std::vector<double>{1.0 + std::ldexp(1.0, -7), 70144.0, -1000.0}));
  EXPECT_EQ(out.at("h"), (std::vector<double>{1.0 + std::ldexp(1.0, -8), kInf, -1000.0}));
  EXPECT_EQ(out.at("e4"), (std::vector<double>{1.0, 448.0, -448.0}));
  EXPECT_EQ(out.at("e5"), (std::vector<double>{1.0, 57344.0, -1024.0}));
}

// --- input validation --------------------------------------------------------------------

TEST(ReferenceErrors, MissingOperand) {
  Graph g;
  g.store("D", g.accum() + g.row_vec("bias", DType::bf16), DType::bf16);
  EXPECT_EQ(error_of(g, with_acc(2, 3, {1, 2, 3, 4, 5, 6})),
            "operand 'bias' (row_vec bf16[n]) was not given");
}

TEST(ReferenceErrors, MissingScalarParameter) {
  Graph g;
  g.store("D", g.accum() * g.param("alpha"), DType::bf16);
  EXPECT_EQ(error_of(g, with_acc(1, 1, {1})), "operand 'alpha' (scalar f32) was not given");
}

TEST(ReferenceErrors, WrongOperandLengths) {
  Graph g;
  auto acc = g.accum();
  g.store("D", acc + g.row_vec("bias", DType::bf16) + g.col_vec("scale", DType::f32) +
                   g.aux("res", DType::bf16) + g.param("alpha"),
          DType::bf16);
  ReferenceInputs in = with_acc(2, 3, {1, 2, 3, 4, 5, 6});
  in.operands = {{"bias", {1, 2}}, {"scale", {1, 2}}, {"res", {1, 2, 3, 4, 5, 6}}, {"alpha", {1}}};
  EXPECT_EQ(error_of(g, in), "operand 'bias' has 2 values, expected n=3");
  in.operands["bias"] = {1, 2, 3};
  in.operands["scale"] = {1, 2, 3};
  EXPECT_EQ(error_of(g, in), "operand 'scale' has 3 values, expected m=2");
  in.operands["scale"] = {1, 2};
  in.operands["res"] = {1};
  EXPECT_EQ(error_of(g, in), "operand 'res' has 1 value, expected m*n=6");
  in.operands["res"] = {1, 2, 3, 4, 5, 6};
  in.operands["alpha"] = {};
  EXPECT_EQ(error_of(g, in), "operand 'alpha' has 0 values, expected 1 (a scalar)");
  in.operands["alpha"] = {1};
  EXPECT_EQ(error_of(g, in), "(no error)");
}

TEST(ReferenceErrors, MissingOrWrongC) {
  Graph g;
  g.store("D", g.accum() + g.source(DType::bf16), DType::bf16);
  ReferenceInputs in = with_acc(2, 3, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(error_of(g, in), "the graph reads C (source bf16[m,n]) but C was not given");
  in.c = {1, 2, 3};
  EXPECT_EQ(error_of(g, in), "C has 3 values, expected m*n=6");
}

TEST(ReferenceErrors, WrongAOrBOrAccumulator) {
  Graph g;
  g.store("D", g.accum(), DType::bf16);
  ReferenceInputs in = hand_problem();
  in.a.pop_back();
  EXPECT_EQ(error_of(g, in), "A has 3 values, expected m*k=4");
  in = hand_problem();
  in.b.push_back(1);
  EXPECT_EQ(error_of(g, in), "B has 7 values, expected k*n=6");
  in = hand_problem();
  in.k = 0;
  EXPECT_EQ(error_of(g, in), "problem size k=0: k must be positive to compute A@B (or give acc)");
  EXPECT_EQ(error_of(g, with_acc(2, 3, {1, 2})), "acc has 2 values, expected m*n=6");
  EXPECT_EQ(error_of(g, with_acc(0, 3, {})), "problem size m=0, n=3: m and n must be positive");
}

// --- the fp64 product ----------------------------------------------------------------------

TEST(ReferenceGemm, MatchesANaiveLoopBitForBitAcrossTiles) {
  // Sizes that are not multiples of the tiles, large enough to run on several threads.
  const int64_t m = 37, n = 600, k = 300;
  const ReferenceInputs in = random_reference_inputs(Graph{}, m, n, k, DType::f32, DType::f32, 7);
  Graph g;
  g.store("D", g.accum(), DType::f32);
  const std::vector<double> got = evaluate_reference(g, in).at("D");  // rounded by the f32 store
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) s += in.a[i * k + kk] * in.b[kk * n + j];
      ASSERT_EQ(got[i * n + j], round_to(DType::f32, s)) << "at " << i << "," << j;
    }
}

TEST(ReferenceGemm, ZeroTimesInfinityIsNaN) {
  Graph g;
  g.store("D", g.accum(), DType::f32);
  ReferenceInputs in;
  in.m = 1;
  in.n = 2;
  in.k = 2;
  in.a = {0.0, 1.0};
  in.b = {kInf, 1.0, 1.0, 1.0};
  const std::vector<double> d = evaluate_reference(g, in).at("D");
  EXPECT_TRUE(std::isnan(d[0]));  // 0*inf + 1*1
  EXPECT_EQ(d[1], 1.0);            // 0*1 + 1*1
}

// --- random inputs -----------------------------------------------------------------------

namespace {
Graph graph_with_every_operand() {
  Graph g;
  auto x = g.accum() + g.row_vec("bias", DType::bf16) + g.col_vec("scale", DType::f16) +
           g.aux("res", DType::f8e4m3) + g.param("alpha") + g.source(DType::bf16);
  g.store("D", x, DType::bf16);
  return g;
}
}  // namespace

TEST(ReferenceRandom, FillsEveryInputWithValuesOfItsDtype) {
  const Graph g = graph_with_every_operand();
  const ReferenceInputs in = random_reference_inputs(g, 5, 7, 3, DType::f8e4m3, DType::bf16, 1);
  EXPECT_EQ(in.a.size(), 15u);
  EXPECT_EQ(in.b.size(), 21u);
  EXPECT_EQ(in.c.size(), 35u);
  EXPECT_TRUE(in.acc.empty());
  EXPECT_EQ(in.operands.at("bias").size(), 7u);
  EXPECT_EQ(in.operands.at("scale").size(), 5u);
  EXPECT_EQ(in.operands.at("res").size(), 35u);
  EXPECT_EQ(in.operands.at("alpha").size(), 1u);
  auto check_dtype = [](const std::vector<double>& v, DType t, const char* what) {
    size_t nonzero = 0;
    for (double x : v) {
      EXPECT_EQ(x, round_to(t, x)) << what;
      EXPECT_TRUE(std::isfinite(x)) << what;
      nonzero += x != 0.0;
    }
    EXPECT_GT(nonzero, v.size() / 2) << what << " is mostly zeros";
  };
  check_dtype(in.a, DType::f8e4m3, "A");
  check_dtype(in.b, DType::bf16, "B");
  check_dtype(in.c, DType::bf16, "C");
  check_dtype(in.operands.at("bias"), DType::bf16, "bias");
  check_dtype(in.operands.at("scale"), DType::f16, "scale");
  check_dtype(in.operands.at("res"), DType::f8e4m3, "res");
  EXPECT_NO_THROW(evaluate_reference(g, in));
}

// Integer operands are indices of the other axis: a label per row in [-1, n], per column in
// [-1, m], so that `n == t[m]` holds at some elements and not at others; never all zeros.
TEST(ReferenceRandom, IntegerOperandsAreIndicesOfTheOtherAxis) {
  Graph g;
  auto acc = g.accum();
  auto t = g.col_vec("t", DType::i32);
  auto q = g.row_vec("q", DType::i64);
  g.store("D", g.compute(Op::where, {g.compute(Op::eq, {g.index(IndexAxis::n), t}), acc, q}), DType::f32);
  const int64_t m = 300, n = 40;
  const ReferenceInputs in = random_reference_inputs(g, m, n, 8, DType::bf16, DType::bf16, 7);
  const auto& labels = in.operands.at("t");
  const auto& rows = in.operands.at("q");
  ASSERT_EQ(labels.size(), size_t(m));
  ASSERT_EQ(rows.size(), size_t(n));
  std::set<double> seen;
  for (double v : labels) {
    EXPECT_EQ(v, std::nearbyint(v));
    EXPECT_GE(v, -1);
    EXPECT_LE(v, double(n));
    seen.insert(v);
  }
  for (double v : rows) {
    EXPECT_EQ(v, std::nearbyint(v));
    EXPECT_GE(v, -1);
    EXPECT_LE(v, double(m));
  }
  // 300 draws from 42 values: both ends and most of the range appear.
  EXPECT_TRUE(seen.count(-1) && seen.count(double(n)));
  EXPECT_GT(seen.size(), 30u);
  const ReferenceOutputs out = evaluate_reference(g, in);
  size_t hits = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) hits += labels[size_t(i)] == double(j);
  EXPECT_GT(hits, 0u);
  EXPECT_LT(hits, size_t(m));
  EXPECT_EQ(random_reference_inputs(g, m, n, 8, DType::bf16, DType::bf16, 7).operands.at("t"), labels);
}

TEST(ReferenceRandom, DeterministicForASeedAndFreshAcrossSeeds) {
  const Graph g = graph_with_every_operand();
  const ReferenceInputs a = random_reference_inputs(g, 8, 9, 10, DType::bf16, DType::bf16, 42);
  const ReferenceInputs b = random_reference_inputs(g, 8, 9, 10, DType::bf16, DType::bf16, 42);
  const ReferenceInputs c = random_reference_inputs(g, 8, 9, 10, DType::bf16, DType::bf16, 43);
  EXPECT_EQ(a.a, b.a);
  EXPECT_EQ(a.b, b.b);
  EXPECT_EQ(a.c, b.c);
  EXPECT_EQ(a.operands, b.operands);
  EXPECT_NE(a.a, c.a);
  EXPECT_NE(a.b, c.b);
  EXPECT_NE(a.c, c.c);
  for (const auto& [name, values] : a.operands) EXPECT_NE(values, c.operands.at(name)) << name;
  // Different inputs draw from different streams.
  EXPECT_NE(std::vector<double>(a.a.begin(), a.a.begin() + 8),
            std::vector<double>(a.c.begin(), a.c.begin() + 8));
}

TEST(ReferenceRandom, AddingAnOperandKeepsTheOthersValues) {
  Graph small;
  small.store("D", small.accum() + small.row_vec("bias", DType::bf16), DType::bf16);
  const ReferenceInputs a = random_reference_inputs(small, 4, 6, 8, DType::bf16, DType::bf16, 3);
  const ReferenceInputs b =
      random_reference_inputs(graph_with_every_operand(), 4, 6, 8, DType::bf16, DType::bf16, 3);
  EXPECT_EQ(a.a, b.a);
  EXPECT_EQ(a.operands.at("bias"), b.operands.at("bias"));
  EXPECT_TRUE(a.c.empty());  // the small graph does not read C
}

TEST(ReferenceRandom, AccumulatorIsAboutUnitNormal) {
  Graph g;
  g.store("D", g.accum(), DType::f32);
  const ReferenceInputs in = random_reference_inputs(g, 64, 64, 1024, DType::bf16, DType::bf16, 5);
  const std::vector<double> d = evaluate_reference(g, in).at("D");
  double sum = 0, sum_sq = 0;
  for (double x : d) {
    sum += x;
    sum_sq += x * x;
  }
  const double mean = sum / d.size(), stddev = std::sqrt(sum_sq / d.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.1);
  EXPECT_NEAR(stddev, 1.0, 0.1);
}

TEST(ReferenceRandom, RejectsEmptyProblems) {
  EXPECT_THROW(random_reference_inputs(Graph{}, 4, 0, 8, DType::bf16, DType::bf16, 1), UserError);
}

// --- comparison --------------------------------------------------------------------------

namespace {
// A reference output in fp64 and a device-like result: the same values computed with a
// small relative error (as f32 arithmetic would), both rounded to `dtype`.
std::pair<std::vector<double>, std::vector<double>> device_like(DType dtype, size_t count,
                                                                double noise) {
  const ReferenceInputs r = random_reference_inputs(Graph{}, 1, count, 1, DType::f32, DType::f32, 9);
  std::vector<double> got(count), want(count);
  for (size_t i = 0; i < count; ++i) {
    const double truth = r.b[i] * 3.0;
    const double sign = (i % 3 == 0) ? 1.0 : (i % 3 == 1 ? -1.0 : 0.5);
    want[i] = round_to(dtype, truth);
    got[i] = round_to(dtype, truth * (1.0 + sign * noise));
  }
  return {got, want};
}
}  // namespace

TEST(ReferenceCompare, PassesOnIndependentlyRoundedResults) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::f8e4m3, DType::f8e5m2}) {
    SCOPED_TRACE(dtype_name(t));
    auto [got, want] = device_like(t, 4096, 1e-6);
    const Comparison c = compare_outputs(got, want, t);
    EXPECT_TRUE(c.pass) << c.describe();
    EXPECT_EQ(c.mismatches, 0u);
    EXPECT_NE(c.describe().find("PASS"), std::string::npos);
  }
}

TEST(ReferenceCompare, PerElementBoundAllowsAOneUlpFlipInBf16) {
  // Worst case of independent rounding: a value just above a power of two flips by one ulp.
  std::vector<double> want(64, 1.0), got(64, 1.0 + std::ldexp(1.0, -7));
  want.push_back(-3.0);
  got.push_back(-3.0);
  const Comparison c = compare_outputs(got, want, DType::bf16);
  EXPECT_EQ(c.mismatches, 0u) << c.describe();
}

TEST(ReferenceCompare, FailsOnASingleWrongElement) {
  auto [got, want] = device_like(DType::bf16, 1000, 0.0);
  got[17] = round_to(DType::bf16, want[17] + 0.5);
  const Comparison c = compare_outputs(got, want, DType::bf16);
  EXPECT_FALSE(c.pass);
  EXPECT_EQ(c.mismatches, 1u);
  EXPECT_EQ(c.first_bad, 17u);
  EXPECT_EQ(c.first_bad_want, want[17]);
  EXPECT_NE(c.describe().find("FAIL"), std::string::npos);
  EXPECT_NE(c.describe().find("first at [17]"), std::string::npos) << c.describe();
}

TEST(ReferenceCompare, FailsOnNaNWhereTheReferenceIsFinite) {
  auto [got, want] = device_like(DType::bf16, 100, 0.0);
  got[3] = kNaN;
  Comparison c = compare_outputs(got, want, DType::bf16);
  EXPECT_FALSE(c.pass);
  EXPECT_EQ(c.nan_mismatch, 1u);
  EXPECT_EQ(c.mismatches, 1u);
  // NaN where the reference has NaN is a match.
  want[3] = kNaN;
  c = compare_outputs(got, want, DType::bf16);
  EXPECT_TRUE(c.pass) << c.describe();
  // A finite value where the reference is NaN is not.
  got[3] = 1.0;
  EXPECT_FALSE(compare_outputs(got, want, DType::bf16).pass);
}

TEST(ReferenceCompare, InfinityMustMatchExactly) {
  std::vector<double> want{1.0, kInf, -2.0}, got{1.0, kInf, -2.0};
  EXPECT_TRUE(compare_outputs(got, want, DType::f16).pass);
  got[1] = 65504.0;
  EXPECT_FALSE(compare_outputs(got, want, DType::f16).pass);
  got[1] = -kInf;
  EXPECT_FALSE(compare_outputs(got, want, DType::f16).pass);
  got[1] = kInf;
  got[0] = kInf;
  EXPECT_FALSE(compare_outputs(got, want, DType::f16).pass);
}

TEST(ReferenceCompare, FailsOnAOnePercentErrorInBf16) {
  auto [got, want] = device_like(DType::bf16, 4096, 0.0);
  for (double& x : got) x = round_to(DType::bf16, x * 1.01);
  const Comparison c = compare_outputs(got, want, DType::bf16);
  EXPECT_FALSE(c.pass) << c.describe();
  EXPECT_GT(c.rel_l2, tolerance_for(DType::bf16).max_rel_l2);
}

TEST(ReferenceCompare, AbsoluteFloorScalesWithTheReferenceAndAtolScale) {
  // Near-zero values that cancel: an absolute error far below the data's magnitude passes.
  std::vector<double> want{100.0, -100.0, 0.0}, got{100.0, -100.0, 0.1};
  const Comparison c = compare_outputs(got, want, DType::bf16);
  EXPECT_NEAR(c.atol, std::ldexp(1.0, -7) * std::sqrt(20000.0 / 3.0), 1e-12);
  EXPECT_EQ(c.mismatches, 0u) << c.describe();
  EXPECT_EQ(compare_outputs(got, want, DType::bf16, 0.1).mismatches, 1u);
}

TEST(ReferenceCompare, TolerancesFollowTheDtype) {
  EXPECT_EQ(tolerance_for(DType::bf16).rtol, std::ldexp(1.0, -7));
  EXPECT_EQ(tolerance_for(DType::bf16).max_rel_l2, std::ldexp(1.0, -8));
  EXPECT_EQ(tolerance_for(DType::f16).max_rel_l2, std::ldexp(1.0, -11));
  EXPECT_EQ(tolerance_for(DType::f8e4m3).max_rel_l2, std::ldexp(1.0, -4));
  EXPECT_EQ(tolerance_for(DType::f8e5m2).max_rel_l2, std::ldexp(1.0, -3));
  EXPECT_EQ(tolerance_for(DType::f32).rtol, 1e-5);
  // A 0.5% error is within fp8's bounds but not within f16's.
  auto [got, want] = device_like(DType::f32, 512, 0.0);
  for (double& x : got) x *= 1.005;
  EXPECT_TRUE(compare_outputs(got, want, tolerance_for(DType::f8e4m3)).pass);
  EXPECT_FALSE(compare_outputs(got, want, DType::f16).pass);
}

TEST(ReferenceCompare, RejectsDifferentLengths) {
  const std::vector<double> a{1, 2, 3}, b{1, 2};
  EXPECT_THROW(compare_outputs(a, b, DType::bf16), UserError);
}

// --- evtc ref ------------------------------------------------------------------------------

namespace {
struct CliResult {
  int exit_code;
  std::string output;
};

CliResult run_cli(const std::string& args) {
  const std::string command = std::string(EVTC_CLI_PATH) + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {-1, ""};
  std::string out;
  char buf[4096];
  while (size_t got = fread(buf, 1, sizeof buf, pipe)) out.append(buf, got);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}
}  // namespace

TEST(ReferenceCli, PrintsEachOutput) {
  const CliResult r =
      run_cli("ref 'out D: bf16 = relu(acc + bias[n])' -m 5 -n 7 -k 16 --show 3 --seed 11");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("m=5 n=7 k=16, A and B bf16, seed 11"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("D: bf16 [m,n] = 5x7"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("min 0"), std::string::npos) << r.output;  // relu of random values
  // The same seed prints the same values.
  EXPECT_EQ(run_cli("ref 'out D: bf16 = acc' -m 3 -n 3 -k 4 --seed 2").output,
            run_cli("ref 'out D: bf16 = acc' -m 3 -n 3 -k 4 --seed 2").output);
}

TEST(ReferenceCli, RefusesHugeProblems) {
  const CliResult r = run_cli("ref 'out D: bf16 = acc' -m 65536 -n 65536 -k 65536");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("too large for the CPU reference"), std::string::npos) << r.output;
}

TEST(ReferenceCli, RejectsAnUnknownDtype) {
  const CliResult r = run_cli("ref 'out D: bf16 = acc' -m 4 -n 4 -k 4 --dtype f64");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--dtype: unknown dtype 'f64' (expected f32, f16, bf16, f8e4m3, f8e5m2)"), std::string::npos) << r.output;
}

// A value rounded to bf16 and stored into an f32 output (eager's h.float()) is compared with
// bf16's tolerance: the GPU's accumulation order can move it by one bf16 unit.
TEST(OutputTolerance, AWideOutputOfARoundedValueHasTheRoundedTypesTolerance) {
  const Kernel k(parse_expression("v = bf16(acc * 2)\nout y: f32 = f32(v)\nout D: f32 = acc * 3"));
  EXPECT_EQ(runtime::output_tolerance(k, "y").rtol, tolerance_for(DType::bf16).rtol);
  EXPECT_EQ(runtime::output_tolerance(k, "y").max_rel_l2, tolerance_for(DType::bf16).max_rel_l2);
  EXPECT_EQ(runtime::output_tolerance(k, "D").rtol, tolerance_for(DType::f32).rtol);
}

// --- integer inputs, exact elements and the condition allowance --------------------------------

TEST(ReferenceRandom, IntegerInputsAreSmallIntegersOfEveryOperand) {
  const Graph g = parse_expression("out D = acc * x[m,n] + bias[n] + c[m] + s + C");
  const ReferenceInputs in = random_integer_inputs(g, 37, 24, 40, 7);
  auto all_integers = [](const std::vector<double>& v, double bound) {
    for (double x : v)
      if (x != std::round(x) || std::fabs(x) > bound) return false;
    return true;
  };
  EXPECT_TRUE(all_integers(in.a, 1));
  EXPECT_TRUE(all_integers(in.b, 1));
  EXPECT_TRUE(all_integers(in.c, 3));
  for (const char* name : {"x", "bias", "c", "s"}) EXPECT_TRUE(all_integers(in.operands.at(name), 3)) << name;
  // Not all zero, and a fresh draw for another seed.
  EXPECT_NE(std::count(in.a.begin(), in.a.end(), 0.0), static_cast<long>(in.a.size()));
  EXPECT_NE(random_integer_inputs(g, 37, 24, 40, 8).a, in.a);
}

// With integer inputs an epilogue of ops exact on integers evaluates to the same values with every
// computed value rounded to f32 as in fp64: what lets the device be checked bit for bit.
TEST(ReferenceRandom, ExactOpsOnIntegerInputsAreExactInF32) {
  const Graph g = parse_expression(
      "out D: f32 = fma(relu(acc), x[m,n], square(max(acc, s)) - abs(bias[n]) * clamp(acc, -2, 3))");
  for (const OpInfo& op : op_table())
    if (op.name == "fma" || op.name == "relu" || op.name == "square" || op.name == "clamp")
      EXPECT_TRUE(op.exact_on_integers) << op.name;
  const ReferenceInputs in = random_integer_inputs(g, 64, 48, 96, 3);
  ReferenceOptions f32;
  f32.round_compute = true;
  EXPECT_EQ(evaluate_reference(g, in).at("D"), evaluate_reference(g, in, f32).at("D"));
}

TEST(ReferenceCompare, ExactElementsMustMatchBitForBit) {
  std::vector<double> want(100, 1000.0), got = want;
  got[17] = 1000.0 + std::ldexp(1.0, -13);  // far inside f32's tolerance
  std::vector<char> exact(100, 1);
  const Comparison c = compare_outputs(got, want, tolerance_for(DType::f32), 1.0, {}, exact);
  EXPECT_FALSE(c.pass) << c.describe();
  EXPECT_EQ(c.exact, 100u);
  EXPECT_EQ(c.exact_mismatch, 1u);
  EXPECT_EQ(c.first_bad, 17u);
  EXPECT_NE(c.describe().find("1 of 100 exact values differ"), std::string::npos) << c.describe();
  exact[17] = 0;  // the same difference where the device need not be exact passes
  EXPECT_TRUE(compare_outputs(got, want, tolerance_for(DType::f32), 1.0, {}, exact).pass);
}

// pow(b, tanh(r) * 2): an error of 2^-11 in tanh (the fast hardware form) moves the result by
// ln(b) times as much, beyond bf16's bound where b is large (found by evtc fuzz, seed 31). The
// perturbed reference measures that amplification, and the allowance covers it; a well-conditioned
// output gets an allowance far below its tolerance.
TEST(ReferenceCompare, ConditionAllowanceFollowsTheAmplification) {
  const Graph g = parse_expression("out P: f32 = pow(abs(acc) * 40 + 0.25, tanh(r[n]) * 2)\nout Q: f32 = acc + r[n]");
  const ReferenceInputs in = random_reference_inputs(g, 32, 64, 64, DType::bf16, DType::bf16, 11);
  const ReferenceOutputs want = evaluate_reference(g, in);
  ReferenceOptions p;
  p.perturb = std::ldexp(1.0, -11);
  p.perturb_seed = 5;
  const ReferenceOutputs moved = evaluate_reference(g, in, p);
  auto ratio = [&](const std::string& name) {  // largest |moved - want| over |want| + rms(want)
    const std::vector<double>& v = want.at(name);
    double sq = 0, r = 0;
    for (double x : v) sq += x * x;
    const double rms = std::sqrt(sq / double(v.size()));
    for (size_t i = 0; i < v.size(); ++i) r = std::max(r, std::fabs(moved.at(name)[i] - v[i]) / (std::fabs(v[i]) + rms));
    return r;
  };
  EXPECT_GT(ratio("P"), std::ldexp(1.0, -9));  // amplified past the fast-math bound
  EXPECT_LT(ratio("Q"), std::ldexp(1.0, -10)); // not amplified
  // A device result off by the amplified error: outside the bound alone, inside with the allowance.
  const std::vector<double>& w = want.at("P");
  std::vector<double> got(w.size()), slack(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    slack[i] = 2 * std::fabs(moved.at("P")[i] - w[i]);
    got[i] = w[i] + (moved.at("P")[i] - w[i]);
  }
  Tolerance t{std::ldexp(1.0, -9), std::ldexp(1.0, -10)};
  EXPECT_FALSE(compare_outputs(got, w, t).pass);
  EXPECT_TRUE(compare_outputs(got, w, t, 1.0, slack).pass);
}

// The main loop's error is absolute: an accumulator element that cancels to exactly 0 in fp64
// may be a tiny nonzero value on the device, and a `where` on it switches branch (found by evtc
// fuzz, seed 41, on fp8 inputs). The accumulator's perturbation moves such elements, so their
// allowance covers either branch; elements away from 0 keep a small allowance.
TEST(ReferenceCompare, AccumulatorPerturbationCoversABranchOnACancellingSum) {
  const Graph g = parse_expression("out W: f32 = where(acc, acc + 10, acc - 10)");
  ReferenceInputs in = with_acc(2, 4, {0.0, 1.5, -2.0, 0.0, 3.0, 1e-9, -1.0, 2.5});
  ReferenceOptions p;
  p.perturb_accumulator = std::ldexp(1.0, -11);
  const std::vector<double> want = evaluate_reference(g, in).at("W");
  const std::vector<double> moved = evaluate_reference(g, in, p).at("W");
  for (size_t i = 0; i < want.size(); ++i) {
    const double slack = 2 * std::fabs(moved[i] - want[i]);
    if (std::fabs(in.acc[i]) < 1e-6) EXPECT_GT(slack, 19.0) << i;  // the other branch is 20 away
    else EXPECT_LT(slack, 0.01) << i;
  }
}

// An epilogue that rounds an intermediate value (bf16(...)) and then amplifies it: where the
// value sits at a rounding boundary, the device's f32 value and fp64's round to neighbouring bf16
// values, and the output differs by a step far beyond its tolerance on those elements (found by
// `evtc run --check` on GPT-2's spelled-out GELU: 6 of 52 M elements). `evtc fuzz` and
// `evtc run --check` share one rule in runtime::check_outputs: a few such elements pass, when
// the output rounds an intermediate; the same step without that rounding, or on many elements,
// fails.
TEST(ReferenceCompare, FewFlipsOfAnIntermediateRoundingPassOnlyWhereTheEpilogueRoundsOne) {
  const Kernel rounded(parse_expression("out Y: f32 = bf16(acc) * 64"));
  const Kernel plain(parse_expression("out Y: f32 = acc * 64"));
  EXPECT_TRUE(runtime::rounds_intermediate(rounded.graph(), "Y"));
  EXPECT_FALSE(runtime::rounds_intermediate(plain.graph(), "Y"));
  EXPECT_FALSE(runtime::rounds_intermediate(Kernel(parse_expression("out Y: bf16 = bf16(acc * 2)")).graph(), "Y"));
  EXPECT_TRUE(runtime::rounds_intermediate(
      Kernel(parse_expression("v = bf16(acc * 2)\nout Y: f32 = v * 3")).graph(), "Y"));
  // A rounded value stored as it is: the output's own rounding (its tolerance is the rounded type's).
  EXPECT_FALSE(runtime::rounds_intermediate(
      Kernel(parse_expression("v = bf16(acc * 2)\nout Y: f32 = f32(v)")).graph(), "Y"));
  EXPECT_TRUE(runtime::rounds_intermediate(Kernel(parse_expression("out s: f32 = sum(bf16(acc))")).graph(), "s"));

  for (const Kernel* k : {&rounded, &plain}) {
    const ReferenceInputs in = random_reference_inputs(k->graph(), 40, 64, 32, DType::bf16, DType::bf16, 3);
    const runtime::Expected e = runtime::expected_outputs(*k, in, false);
    // Elements moved beyond their bound (0.02 where it is about 0.001): 5 of 2560, then 40.
    for (size_t flips : {size_t(5), size_t(40)}) {
      ReferenceOutputs got = e.want;
      for (size_t i = 0; i < flips; ++i) got["Y"][61 * i + 7] += 0.02;
      const Comparison c = runtime::check_outputs(*k, got, e).front().comparison;
      const bool allowed = k == &rounded && flips == 5;
      EXPECT_EQ(c.pass, allowed) << flips << " flips: " << c.describe();
      EXPECT_EQ(c.rounding_flips, allowed) << c.describe();
      if (allowed) EXPECT_NE(c.describe().find("allowed: an intermediate value rounded"), std::string::npos);
    }
  }
}

// Two fp8 cases of `evtc fuzz` (seed 51 on the H200) where the device's accumulator is off by
// about 2.5 × 2^-11 of its rms at one element, amplified by what follows (acc² - 1.25; 1/x near
// 0.35). The accumulator's allowance adds the main loop's error step to the relative
// perturbation; it used a sign of its own, so on half of the elements the two cancelled (an
// allowance of 7e-5 where the step alone moves the output by 1e-3). The step now goes the way
// the relative perturbation went, and the device values recorded in that run pass.
TEST(ReferenceCompare, AccumulatorAllowanceDoesNotCancelTheRelativePerturbation) {
  struct Case {
    const char* expr;
    int64_t m, n, k;
    uint64_t seed;
    size_t at;
    double device;  // the device's value there (fused and unfused agreed, or cuBLASLt's)
  };
  for (const Case& c : {Case{"out o6: f32 = clamp(clamp(acc, acc, acc), tanh(c0[m]), fma(acc, acc, -1.25))", 296, 320,
                             272, 11836525716461922457ull, 7953, -0.18715277314186096},
                        Case{"out o7: f32 = (where(r0[n], reciprocal((abs((acc - c1[m])) + 0.25)), "
                             "leaky_relu(x0[m,n])) - 0.75)",
                             408, 304, 192, 10079310745442701057ull, 16517, 2.864633321762085}}) {
    ParseOptions p;
    p.operand_dtype = DType::f32;
    CompileOptions o;
    o.gemm.a_dtype = o.gemm.b_dtype = DType::f8e4m3;
    o.gemm.b_layout = Layout::col_major;
    const Kernel k(parse_expression(c.expr, p), o);
    const ReferenceInputs in = random_reference_inputs(k.graph(), c.m, c.n, c.k, DType::f8e4m3, DType::f8e4m3, c.seed);
    const runtime::Expected e = runtime::expected_outputs(k, in, false);
    ReferenceOutputs got = e.want;
    std::vector<double>& out = got.begin()->second;
    out[c.at] = c.device;
    const Comparison cmp = runtime::check_outputs(k, got, e).front().comparison;
    EXPECT_TRUE(cmp.pass) << c.expr << ": " << cmp.describe();
    // Not by a margin that would hide a real error: ten times the device's difference fails.
    out[c.at] = e.want.begin()->second[c.at] + 10 * (c.device - e.want.begin()->second[c.at]);
    EXPECT_FALSE(runtime::check_outputs(k, got, e).front().comparison.pass) << c.expr;
  }
}

// `acc * (acc >= t[m])` on an H100 (8192×4096×4096): 16 of 33.5 M elements came back as 0
// where fp64 keeps acc, because there the f32 accumulator lies within its rounding of t[m] and
// the comparison lands on the other side. The allowance perturbs the reference both ways when
// the epilogue compares: an element whose threshold lies within the perturbation may flip;
// one far from it may not.
TEST(ReferenceCompare, AComparisonOfAComputedValueMayFlipOnlyAtItsThreshold) {
  const Kernel k(parse_expression("input t[m]: f32\nout Y: f32 = acc * (acc >= t[m])"));
  ReferenceInputs in = random_reference_inputs(k.graph(), 64, 96, 256, DType::bf16, DType::bf16, 5);
  const std::vector<double> acc = evaluate_reference(Kernel(parse_expression("out Y: f32 = acc")).graph(), in).at("Y");
  // Each row's threshold is its column-3 value exactly: acc >= t holds there in fp64.
  std::vector<double>& t = in.operands.at("t");
  for (int64_t i = 0; i < in.m; ++i) t[size_t(i)] = acc[size_t(i * in.n + 3)];
  const runtime::Expected e = runtime::expected_outputs(k, in, false);
  ReferenceOutputs got = e.want;
  std::vector<double>& y = got.at("Y");
  for (int64_t i = 0; i < in.m; i += 7) y[size_t(i * in.n + 3)] = 0.0;  // flipped at the threshold
  const Comparison at_threshold = runtime::check_outputs(k, got, e).front().comparison;
  EXPECT_TRUE(at_threshold.pass) << at_threshold.describe();
  // The same jump where acc is far from t[m] is an error.
  for (int64_t col = 0; col < in.n; ++col)
    if (const double v = acc[size_t(5 * in.n + col)]; std::fabs(v - t[5]) > 0.5 && v >= t[5]) {
      y[size_t(5 * in.n + col)] = 0.0;
      break;
    }
  EXPECT_FALSE(runtime::check_outputs(k, got, e).front().comparison.pass);
}

TEST(ReferenceCompare, RejectsAllowancesAndExactFlagsOfTheWrongLength) {
  const std::vector<double> v(4, 1.0), three(3, 0.0);
  const std::vector<char> flags(3, 1);
  try {
    compare_outputs(v, v, tolerance_for(DType::f32), 1.0, three);
    ADD_FAILURE() << "accepted 3 allowances for 4 values";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot compare with 3 allowances for 4 values"), std::string::npos) << e.what();
  }
  try {
    compare_outputs(v, v, tolerance_for(DType::f32), 1.0, {}, flags);
    ADD_FAILURE() << "accepted 3 exactness flags for 4 values";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot compare with 3 exactness flags for 4 values"), std::string::npos)
        << e.what();
  }
}
