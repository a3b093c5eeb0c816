// Unit tests of the individual passes, the pipeline driver and plan_dag. Most pass behaviour
// is pinned by the golden files (passes_golden_test.cpp); these cover errors, edge cases and
// near misses that read better as code.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "evtc/error.hpp"
#include "evtc/graph.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/passes.hpp"
#include "passes/fold_activations.hpp"

using namespace evtc;

namespace {

Graph run_pass(std::string_view name, const Graph& g, const PipelineOptions& o = {}) {
  const PassInfo* p = find_pass(name);
  EXPECT_NE(p, nullptr) << name;
  return p->run(g, o);
}

std::string after(std::string_view pass, const Graph& g, const PipelineOptions& o = {}) {
  return print(run_pass(pass, g, o));
}

// Runs fold_activations after CSE, as the pipeline does.
std::string folded(const Graph& g) {
  return after("fold_activations", run_pass("eliminate_common_subexpressions", g));
}

std::string verify_error(const Graph& g) {
  try {
    run_pass("verify", g);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

// --- pipeline driver -----------------------------------------------------------------------

TEST(PassPipeline, ListsThePassesInOrder) {
  std::vector<std::string> names;
  for (const PassInfo& p : pipeline_passes()) {
    names.emplace_back(p.name);
    EXPECT_FALSE(p.summary.empty()) << p.name;
    EXPECT_EQ(find_pass(p.name), &p);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"verify", "normalize_casts", "fold_constants",
                                             "eliminate_common_subexpressions",
                                             "eliminate_dead_code", "fold_activations",
                                             "classify_loads", "legality"}));
  EXPECT_EQ(find_pass("no_such_pass"), nullptr);
}

TEST(PassPipeline, ObserverSeesEveryPassAndWhetherItChangedTheGraph) {
  Graph g;
  auto acc = g.accum();
  auto x = cast(acc * 1.0, DType::f32);
  g.store("D", x / (1.0 + exp(-x)), DType::bf16);
  std::vector<std::pair<std::string, bool>> seen;
  const Graph out = run_pipeline(g, {}, [&](const PassInfo& p, const Graph&, bool changed) {
    seen.emplace_back(std::string(p.name), changed);
  });
  EXPECT_EQ(seen, (std::vector<std::pair<std::string, bool>>{{"verify", false},
                                                             {"normalize_casts", true},
                                                             {"fold_constants", true},
                                                             {"eliminate_common_subexpressions", false},
                                                             {"eliminate_dead_code", false},
                                                             {"fold_activations", true},
                                                             {"classify_loads", false},
                                                             {"legality", false}}));
  EXPECT_EQ(print(out),
            "%0 = accum : f32[m,n]\n"
            "%1 = silu %0 : f32[m,n]\n"
            "%2 = store D %1 : bf16[m,n]\n");
}

TEST(PassPipeline, ReportsLegalityThroughTheOptions) {
  Graph g;
  g.store("D", g.accum(), DType::bf16);
  PipelineOptions o;
  o.gemm.k = 1001;
  Legality verdict;
  o.legality = &verdict;
  run_pipeline(g, o);
  EXPECT_EQ(verdict.reasons,
            (std::vector<std::string>{"K=1001 is not a multiple of 8 (bf16 A needs 16-byte rows)",
                                      "K=1001 is not a multiple of 8 (bf16 B needs 16-byte columns)"}));
}

TEST(PassPipeline, RejectsAnIllFormedEpilogueFirst) {
  Graph g;
  g.store("D", g.aux("x", DType::bf16) * 2.0, DType::bf16);
  EXPECT_THROW(run_pipeline(g), UserError);
}

// --- verify ----------------------------------------------------------------------------------

TEST(PassVerify, RequiresTheAccumulator) {
  Graph g;
  g.store("D", g.aux("x", DType::bf16) * 2.0, DType::bf16);
  EXPECT_EQ(verify_error(g), "verify: the epilogue never reads the accumulator acc");
}

TEST(PassVerify, RequiresAnOutput) {
  Graph g;
  relu(g.accum());
  EXPECT_EQ(verify_error(g), "verify: the epilogue has no output");
}

TEST(PassVerify, EveryOutputMustDependOnTheAccumulator) {
  Graph g;
  auto acc = g.accum();
  g.store("D", relu(acc), DType::bf16);
  g.store("copy", g.aux("res", DType::bf16) + 1.0, DType::bf16);
  EXPECT_EQ(verify_error(g),
            "verify: 'out copy': output 'copy' does not depend on the accumulator acc; every "
            "output of a GEMM epilogue must be computed from it");
}

TEST(PassVerify, AnUnreadAccumulatorIsAnError) {
  Graph g;
  g.accum();
  g.store("D", g.source(DType::bf16) * 2.0, DType::bf16);
  EXPECT_EQ(verify_error(g),
            "verify: 'out D': output 'D' does not depend on the accumulator acc; every output "
            "of a GEMM epilogue must be computed from it");
}

TEST(PassVerify, ReductionOutputsAndSourceReadsAreFine) {
  Graph g;
  auto acc = g.accum();
  auto f = acc + g.source(DType::bf16);
  g.store("D", f, DType::bf16);
  g.store("amax", g.reduce(ReduceAxis::all, ReduceOp::amax, f), DType::f32);
  EXPECT_EQ(after("verify", g), print(g));
}

// --- fold_constants ----------------------------------------------------------------------------

TEST(PassFoldConstants, MultiplicationByZeroIsNotFolded) {
  // acc*0 is NaN where acc is infinite or NaN, so it is not 0.
  Graph g;
  g.store("D", g.accum() * 0.0, DType::f32);
  EXPECT_EQ(after("fold_constants", g), print(g));
}

TEST(PassFoldConstants, NaNFoldsToOneCanonicalNaN) {
  Graph g;
  auto z = g.constant(0.0);
  auto inf = g.constant(std::numeric_limits<double>::infinity());
  g.store("D", g.accum() + (z * inf) + log(g.constant(-1.0)), DType::f32);
  const Graph out = run_pass("fold_constants", g);
  EXPECT_EQ(print(out),
            "%0 = accum : f32[m,n]\n"
            "%1 = const nan : f32\n"
            "%2 = add %0, %1 : f32[m,n]\n"
            "%3 = const nan : f32\n"
            "%4 = add %2, %3 : f32[m,n]\n"
            "%5 = store D %4 : f32[m,n]\n");
  // One NaN for CSE to merge.
  EXPECT_EQ(after("eliminate_common_subexpressions", out),
            "%0 = accum : f32[m,n]\n"
            "%1 = const nan : f32\n"
            "%2 = add %0, %1 : f32[m,n]\n"
            "%3 = add %2, %1 : f32[m,n]\n"
            "%4 = store D %3 : f32[m,n]\n");
}

TEST(PassFoldConstants, ReassociatesOnlyOnOneSideOfOne) {
  Graph g;
  auto acc = g.accum();
  g.store("A", (acc * 4.0) * 8.0, DType::f32);      // both >= 1: acc*32
  g.store("B", (acc * 0.25) * 0.5, DType::f32);     // both <= 1: acc*0.125
  g.store("C1", (acc * 4.0) * 0.5, DType::f32);     // 4*acc may overflow where 2*acc does not
  g.store("C2", (acc * -1.0) * 0.5, DType::f32);    // |-1| == 1 never overflows: acc*-0.5
  EXPECT_EQ(after("fold_constants", g),
            "%0 = accum : f32[m,n]\n"
            "%1 = const 32 : f32\n"
            "%2 = mul %0, %1 : f32[m,n]\n"
            "%3 = store A %2 : f32[m,n]\n"
            "%4 = const 0.125 : f32\n"
            "%5 = mul %0, %4 : f32[m,n]\n"
            "%6 = store B %5 : f32[m,n]\n"
            "%7 = const 4 : f32\n"
            "%8 = mul %0, %7 : f32[m,n]\n"
            "%9 = const 0.5 : f32\n"
            "%10 = mul %8, %9 : f32[m,n]\n"
            "%11 = store C1 %10 : f32[m,n]\n"
            "%12 = const -0.5 : f32\n"
            "%13 = mul %0, %12 : f32[m,n]\n"
            "%14 = store C2 %13 : f32[m,n]\n");
}

TEST(PassFoldConstants, ReassociationNeedsAnExactCombinedConstant) {
  Graph g;
  auto acc = g.accum();
  // 3 * 1.1f is not an f32: folding would round the constant, so the product stays.
  g.store("D", (acc * 1.1) * 3.0, DType::f32);
  // Adding constants of different signs could hide an overflow of acc + 1e38.
  g.store("E", (acc + 1e38) + -1e38, DType::f32);
  EXPECT_EQ(after("fold_constants", g), print(g));
}

TEST(PassFoldConstants, InfiniteConstantsAreNotReassociated) {
  Graph g;
  const double inf = std::numeric_limits<double>::infinity();
  g.store("D", (g.accum() * inf) * 2.0, DType::f32);
  EXPECT_EQ(after("fold_constants", g), print(g));
}

TEST(PassFoldConstants, SquaresAndCubesBecomeProducts) {
  Graph g;
  auto acc = g.accum();
  auto h = cast(acc, DType::bf16);
  g.store("A", cast(apply(Op::pow, {h, g.constant(3.0)}), DType::bf16), DType::bf16);
  g.store("B", apply(Op::pow, {acc, g.constant(2.0)}), DType::f32);
  g.store("C", apply(Op::pow, {acc, g.constant(2.5)}), DType::f32);  // powf stays
  EXPECT_EQ(after("fold_constants", g),
            "%0 = accum : f32[m,n]\n"
            "%1 = cast %0 : bf16[m,n]\n"
            "%2 = mul %1, %1 : f32[m,n]\n"
            "%3 = mul %2, %1 : f32[m,n]\n"
            "%4 = store A %3 : bf16[m,n]\n"  // the store rounds as the cast did
            "%5 = mul %0, %0 : f32[m,n]\n"
            "%6 = store B %5 : f32[m,n]\n"
            "%7 = const 2.5 : f32\n"
            "%8 = pow %0, %7 : f32[m,n]\n"
            "%9 = store C %8 : f32[m,n]\n");
}

TEST(PassFoldActivations, TanhGeluWithACubeStillFolds) {
  // x**3 becomes (x*x)*x before fold_activations, which knows that spelling too.
  Graph g;
  auto x = g.accum();
  auto cube = apply(Op::pow, {x, g.constant(3.0)});
  g.store("D", 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * cube))), DType::f32);
  const Graph out = run_pipeline(g, PipelineOptions{});
  EXPECT_NE(print(out).find("gelu_tanh"), std::string::npos) << print(out);
}

TEST(PassFoldConstants, ChainsFoldInOnePass) {
  Graph g;
  auto acc = g.accum();
  // ((acc*2)*3)*4 -> acc*24; (acc*2)*0.5 -> not reassociated (2 >= 1 > 0.5).
  g.store("D", -(-(((acc * 2.0) * 3.0) * 4.0)), DType::f32);
  const Graph once = run_pass("fold_constants", g);
  EXPECT_EQ(print(once),
            "%0 = accum : f32[m,n]\n"
            "%1 = const 24 : f32\n"
            "%2 = mul %0, %1 : f32[m,n]\n"
            "%3 = store D %2 : f32[m,n]\n");
  EXPECT_EQ(after("fold_constants", once), print(once));
}

TEST(PassFoldConstants, ParametersAreNotConstants) {
  Graph g;
  auto alpha = g.param("alpha");
  g.store("D", g.accum() * (alpha * 2.0), DType::f32);
  EXPECT_EQ(after("fold_constants", g), print(g));
}

TEST(PassFoldConstants, KeepsDeadCodeForDeadCodeElimination) {
  Graph g;
  auto acc = g.accum();
  g.store("D", acc, DType::f32);
  relu(acc * 1.0);  // dead, and simplified in place
  EXPECT_EQ(after("fold_constants", g),
            "%0 = accum : f32[m,n]\n"
            "%1 = store D %0 : f32[m,n]\n"
            "%2 = relu %0 : f32[m,n]\n");
}

// --- eliminate_common_subexpressions / eliminate_dead_code --------------------------------

TEST(PassCse, MergesCommutedOperandsAndEqualConstants) {
  Graph g;
  auto acc = g.accum();
  auto b = g.row_vec("b", DType::bf16);
  auto first = max(acc, b) * 3.0;
  auto second = max(b, acc) * 3.0;
  g.store("D", first + second, DType::bf16);
  EXPECT_EQ(after("eliminate_common_subexpressions", g),
            "%0 = accum : f32[m,n]\n"
            "%1 = row_vec b : bf16[n]\n"
            "%2 = max %0, %1 : f32[m,n]\n"
            "%3 = const 3 : f32\n"
            "%4 = mul %2, %3 : f32[m,n]\n"
            "%5 = add %4, %4 : f32[m,n]\n"
            "%6 = store D %5 : bf16[m,n]\n");
}

TEST(PassCse, KeepsEachReductionForItsOutput) {
  Graph g;
  auto acc = g.accum();
  g.store("s1", g.reduce(ReduceAxis::row, ReduceOp::sum, acc), DType::f32);
  g.store("s2", g.reduce(ReduceAxis::row, ReduceOp::sum, acc), DType::f32);
  EXPECT_EQ(after("eliminate_common_subexpressions", g), print(g));
}

TEST(PassDce, DropsUnreadOperands) {
  Graph g;
  auto acc = g.accum();
  g.param("unused_scale");
  g.col_vec("unused_vec", DType::f32);
  g.store("D", acc, DType::bf16);
  EXPECT_EQ(after("eliminate_dead_code", g),
            "%0 = accum : f32[m,n]\n"
            "%1 = store D %0 : bf16[m,n]\n");
}

// --- fold_activations: near misses and sharing ---------------------------------------------

TEST(PassFoldActivations, SigmoidAloneIsNotSilu) {
  Graph g;
  g.store("D", sigmoid(g.accum()), DType::bf16);
  EXPECT_EQ(folded(g), print(g));
}

TEST(PassFoldActivations, SiluNeedsTheSameOperandTwice) {
  Graph g;
  auto acc = g.accum();
  auto y = acc + g.row_vec("b", DType::bf16);
  g.store("D", acc / (1.0 + exp(-y)), DType::bf16);     // x/(1+exp(-y))
  g.store("E", acc * sigmoid(y), DType::bf16);          // x*sigmoid(y)
  EXPECT_EQ(folded(g),
            print(run_pass("eliminate_common_subexpressions", g)));
}

TEST(PassFoldActivations, GeluConstantsMustMatchWithinTolerance) {
  auto gelu_with = [](double c) {
    Graph g;
    auto x = g.accum();
    g.store("D", 0.5 * x * (1.0 + g.compute(Op::erf, {x * c})), DType::f32);
    return g;
  };
  const std::string native =
      "%0 = accum : f32[m,n]\n"
      "%1 = gelu %0 : f32[m,n]\n"
      "%2 = store D %1 : f32[m,n]\n";
  const double c = 1 / std::sqrt(2.0);
  EXPECT_EQ(folded(gelu_with(c)), native);
  EXPECT_EQ(folded(gelu_with(c * (1 + 0.5e-4))), native);  // inside 1e-4
  EXPECT_EQ(folded(gelu_with(c * (1 - 0.9e-4))), native);
  EXPECT_NE(folded(gelu_with(c * (1 + 2e-4))), native);    // outside
  EXPECT_NE(folded(gelu_with(0.8)), native);
}

TEST(PassFoldActivations, QuickGeluScaleMustMatch) {
  Graph g;
  auto x = g.accum();
  g.store("D", x * sigmoid(1.702 * x), DType::bf16);
  g.store("E", x * sigmoid(1.6 * x), DType::bf16);
  EXPECT_EQ(folded(g),
            "%0 = accum : f32[m,n]\n"
            "%1 = quick_gelu %0 : f32[m,n]\n"
            "%2 = store D %1 : bf16[m,n]\n"
            "%3 = const 1.600000023841858 : f32\n"
            "%4 = mul %3, %0 : f32[m,n]\n"
            "%5 = sigmoid %4 : f32[m,n]\n"
            "%6 = mul %0, %5 : f32[m,n]\n"
            "%7 = store E %6 : bf16[m,n]\n");
}

TEST(PassFoldActivations, SharedIntermediateKeepsTheDecomposition) {
  Graph g;
  auto x = g.accum();
  auto s = sigmoid(x);
  g.store("D", x * s, DType::bf16);  // would be silu, but sigmoid(x) is also an output
  g.store("gate", s, DType::bf16);
  EXPECT_EQ(folded(g), print(g));
}

TEST(PassFoldActivations, SharedOperandIsFine) {
  // x itself may have any number of other users: it is the activation's operand.
  Graph g;
  auto x = g.accum() + g.row_vec("b", DType::bf16);
  g.store("D", x * sigmoid(x), DType::bf16);
  g.store("pre", x, DType::bf16);
  EXPECT_EQ(folded(g),
            "%0 = accum : f32[m,n]\n"
            "%1 = row_vec b : bf16[n]\n"
            "%2 = add %0, %1 : f32[m,n]\n"
            "%3 = silu %2 : f32[m,n]\n"
            "%4 = store D %3 : bf16[m,n]\n"
            "%5 = store pre %2 : bf16[m,n]\n");
}

TEST(PassFoldActivations, ClampNeedsOrderedConstantBounds) {
  Graph g;
  auto x = g.accum();
  auto lo = g.param("lo");
  g.store("A", min(max(x, lo), g.constant(6.0)), DType::bf16);                 // lo not constant
  g.store("B", min(max(x, g.constant(6.0)), g.constant(-6.0)), DType::bf16);   // lo > hi
  g.store("C1", min(max(x, g.constant(-6.0)), g.constant(-6.0)), DType::bf16); // lo == hi
  const std::string out = folded(g);
  EXPECT_NE(out.find("clamp %0, %"), std::string::npos) << out;
  EXPECT_EQ(out.find("clamp", out.find("clamp") + 1), std::string::npos) << out;  // only C1
  EXPECT_NE(out.find("max %0, %"), std::string::npos) << out;
}

TEST(PassFoldActivations, Bf16ArithmeticIsADifferentComputation) {
  // A silu spelled in bf16 arithmetic rounds every step to bf16; the native op would not.
  Graph g;
  auto xb = cast(g.accum(), DType::bf16);
  auto s = g.compute(Op::sigmoid, {xb}, {}, DType::bf16);
  g.store("D", g.compute(Op::mul, {xb, s}, {}, DType::bf16), DType::bf16);
  EXPECT_EQ(folded(g), print(g));
}

TEST(PassFoldActivations, ScalarAndBroadcastOperandsFoldToo) {
  Graph g;
  auto acc = g.accum();
  auto b = g.row_vec("b", DType::f32);
  auto zero = g.constant(0.0);
  g.store("D", acc * max(b, zero), DType::bf16);
  EXPECT_EQ(folded(g),
            "%0 = accum : f32[m,n]\n"
            "%1 = row_vec b : f32[n]\n"
            "%2 = relu %1 : f32[n]\n"
            "%3 = mul %0, %2 : f32[m,n]\n"
            "%4 = store D %3 : bf16[m,n]\n");
}

// --- normalize_casts ---------------------------------------------------------------------------

// The three modes on one graph: the accumulator rounded to bf16, silu computed in bf16, a fake
// fp8 quantisation as written, a product with a bf16 operand in bf16, and a widening cast before
// an f32 store. eager keeps every narrowing cast (fp8 -> bf16 widens, so it goes in every mode);
// fast removes every cast and computes in f32; compile keeps the GEMM's own rounding (the library
// GEMM writes it) and the fp8 one, and elides the other 16-bit roundings, as Inductor does
// between the ops it fuses.
TEST(PassNormalizeCasts, EachModeKeepsItsRoundings) {
  Graph g;
  auto h = cast(g.accum(), DType::bf16);
  auto s = cast(g.compute(Op::silu, {h}, {}, DType::bf16), DType::bf16);
  auto q = cast(cast(s, DType::f8e4m3), DType::bf16);
  auto y = g.compute(Op::mul, {q, g.aux("u", DType::bf16)}, {}, DType::bf16);
  g.store("D", cast(y, DType::f32) * 2.0, DType::f32);
  const std::pair<CastMode, std::string> cases[] = {
      {CastMode::eager,
       "%0 = accum : f32[m,n]\n%1 = cast %0 : bf16[m,n]\n%2 = silu %1 : bf16[m,n]\n%3 = cast %2 : f8e4m3[m,n]\n"
       "%4 = aux u : bf16[m,n]\n%5 = mul %3, %4 : bf16[m,n]\n%6 = const 2 : f32\n%7 = mul %5, %6 : f32[m,n]\n"
       "%8 = store D %7 : f32[m,n]\n"},
      {CastMode::fast,
       "%0 = accum : f32[m,n]\n%1 = silu %0 : f32[m,n]\n%2 = aux u : bf16[m,n]\n%3 = mul %1, %2 : f32[m,n]\n"
       "%4 = const 2 : f32\n%5 = mul %3, %4 : f32[m,n]\n%6 = store D %5 : f32[m,n]\n"},
      {CastMode::compile,
       "%0 = accum : f32[m,n]\n%1 = cast %0 : bf16[m,n]\n%2 = silu %1 : f32[m,n]\n%3 = cast %2 : f8e4m3[m,n]\n"
       "%4 = aux u : bf16[m,n]\n%5 = mul %3, %4 : f32[m,n]\n%6 = const 2 : f32\n%7 = mul %5, %6 : f32[m,n]\n"
       "%8 = store D %7 : f32[m,n]\n"},
  };
  for (const auto& [mode, want] : cases) {
    PipelineOptions o;
    o.cast_mode = mode;
    EXPECT_EQ(after("normalize_casts", g, o), want) << cast_mode_name(mode);
    EXPECT_EQ(cast_mode_named(cast_mode_name(mode)), mode);
  }
  EXPECT_FALSE(cast_mode_named("slow").has_value());
}

// compile mode keeps the rounding of what a library GEMM writes itself: the accumulator, and
// the accumulator with addmm's bias or _scaled_mm's scales (cuBLAS applies them in its epilogue
// and writes the result rounded), before the ops a compiler fuses read it. An [m,n] operand or
// any other op makes the value a fused kernel's, whose 16-bit rounding goes.
TEST(PassNormalizeCasts, CompileKeepsTheLibraryGemmsRoundingOfItsBiasAndScales) {
  auto compile_mode = [](const Graph& g) {
    PipelineOptions o;
    o.cast_mode = CastMode::compile;
    return after("normalize_casts", g, o);
  };
  {  // addmm(bias, a, b), then tanh: the pre-activation is the library's, rounded
    Graph g;
    auto h = cast(g.accum() + g.row_vec("bias", DType::bf16), DType::bf16);
    g.store("pre", h, DType::bf16);
    g.store("D", cast(tanh(h), DType::bf16), DType::bf16);
    EXPECT_EQ(compile_mode(g),
              "%0 = accum : f32[m,n]\n%1 = row_vec bias : bf16[n]\n%2 = add %0, %1 : f32[m,n]\n"
              "%3 = cast %2 : bf16[m,n]\n%4 = tanh %3 : f32[m,n]\n%5 = store D %4 : bf16[m,n]\n"
              "%6 = store pre %2 : bf16[m,n]\n");
  }
  auto casts = [](const std::string& ir) {  // the IR's cast nodes, as "cast %operand"
    std::vector<std::string> found;
    for (size_t at = ir.find("= cast %"); at != std::string::npos; at = ir.find("= cast %", at + 1))
      found.push_back(ir.substr(at + 2, ir.find(' ', at + 8) - at - 2));
    return found;
  };
  {  // _scaled_mm's row-wise scales and bias, and addmm's alpha and beta: both roundings stay
    Graph g;
    auto scaled = g.accum() * g.col_vec("sa", DType::f32) * g.row_vec("sb", DType::f32) + g.row_vec("b", DType::bf16);
    g.store("D", relu(cast(scaled, DType::bf16)), DType::bf16);
    g.store("E", relu(cast(g.accum() * 2.0 + g.row_vec("c", DType::bf16) * 0.5, DType::bf16)), DType::bf16);
    EXPECT_EQ(casts(compile_mode(g)).size(), 2u) << compile_mode(g);
  }
  {  // an [m,n] operand, another op, or a rounded value offset again: a fused kernel's values,
     // whose rounding goes (only the accumulator's own rounding in F stays)
    Graph g;
    g.store("D", relu(cast(g.accum() * g.aux("u", DType::bf16), DType::bf16)), DType::bf16);
    g.store("E", relu(cast(relu(g.accum()) + g.row_vec("b", DType::bf16), DType::bf16)), DType::bf16);
    g.store("F", relu(cast(cast(g.accum(), DType::bf16) + g.row_vec("c", DType::bf16), DType::bf16)),
            DType::bf16);
    EXPECT_EQ(casts(compile_mode(g)), std::vector<std::string>{"cast %0"}) << compile_mode(g);
  }
}

TEST(PassNormalizeCasts, CastBeforeAStoreOfAnotherTypeStays) {
  Graph g;
  g.store("D", cast(g.accum(), DType::bf16), DType::f8e4m3);  // rounds twice, as written
  EXPECT_EQ(after("normalize_casts", g), print(g));
}

TEST(PassNormalizeCasts, SharedCastBeforeAStoreStaysForItsOtherUsers) {
  Graph g;
  auto h = cast(g.accum(), DType::bf16);
  g.store("D", h, DType::bf16);
  g.store("E", h * 2.0, DType::f32);
  EXPECT_EQ(after("normalize_casts", g),
            "%0 = accum : f32[m,n]\n"
            "%1 = store D %0 : bf16[m,n]\n"
            "%2 = cast %0 : bf16[m,n]\n"
            "%3 = const 2 : f32\n"
            "%4 = mul %2, %3 : f32[m,n]\n"
            "%5 = store E %4 : f32[m,n]\n");
}

// --- plan_dag ----------------------------------------------------------------------------------

TEST(PassPlanDag, SharesComputeNodesWithSeveralUses) {
  Graph g;
  auto acc = g.accum();
  auto bias = g.row_vec("bias", DType::bf16);
  auto f = acc + bias;                 // used by relu and by the store 'pre'
  auto r = relu(f);                    // used twice by one mul
  auto once = sigmoid(acc);            // used once
  auto h = cast(f, DType::bf16);       // a cast with two uses
  g.store("pre", f, DType::bf16);
  g.store("D", r * r + once + bias, DType::bf16);
  g.store("H1", h, DType::bf16);
  g.store("H2", h * 2.0, DType::f32);
  const DagPlan plan = plan_dag(g);
  ASSERT_EQ(plan.shared.size(), g.size());
  EXPECT_TRUE(plan.shared[f.id]);
  EXPECT_TRUE(plan.shared[r.id]);
  EXPECT_TRUE(plan.shared[h.id]);
  EXPECT_FALSE(plan.shared[once.id]);
  EXPECT_FALSE(plan.shared[acc.id]);   // the accumulator is a leaf fetch
  EXPECT_FALSE(plan.shared[bias.id]);  // broadcasts are re-read
}

TEST(PassPlanDag, LoadsAreNeverSharedAndDeadUsesDoNotCount) {
  Graph g;
  auto acc = g.accum();
  auto s = g.param("s");
  auto c = g.source(DType::bf16);
  auto aux = g.aux("res", DType::bf16);
  auto e = exp(acc);
  g.store("D", acc * s + c * s + aux * aux + e, DType::bf16);
  (void)(e * 2.0);  // dead: e still has one live use
  const DagPlan plan = plan_dag(g);
  for (auto v : {acc, s, c, aux, e}) EXPECT_FALSE(plan.shared[v.id]) << g.describe(v.id);
}

// The emitted-load counts the shared-memory model reads: in one tree every use of an aux operand
// is its own load; in a topological visitor an operand of an op that takes materialised values
// is materialised itself and loaded once.
TEST(PassPlanDag, ReadsCountEachEmittedLoad) {
  {
    Graph g;
    auto acc = g.accum();
    auto x = g.aux("x", DType::f32);
    g.store("D", exp(acc * x) + x, DType::bf16);
    const DagPlan plan = plan_dag(g, "D");
    EXPECT_TRUE(plan.tree);
    EXPECT_EQ(plan.reads[x.id], 2);
  }
  {
    Graph g;
    auto acc = g.accum();
    auto x = g.aux("x", DType::f32);
    auto f = acc * x;  // shared: D and g1 use it
    g.store("D", f, DType::bf16);
    g.store("g1", f * x, DType::bf16);  // takes f (materialised), so x is materialised too
    g.store("g2", sigmoid(acc + x), DType::bf16);
    const DagPlan plan = plan_dag(g, "D");
    EXPECT_FALSE(plan.tree);
    ASSERT_TRUE(plan.d_value.has_value());
    EXPECT_EQ(*plan.d_value, f.id);
    EXPECT_EQ(plan.terminals.size(), 2u);
    EXPECT_TRUE(plan.materialised[f.id]);
    EXPECT_TRUE(plan.materialised[x.id]);
    EXPECT_EQ(plan.reads[x.id], 1);
  }
}

// --- the activation table ------------------------------------------------------------------

TEST(PassFoldActivations, EveryTableEntryHasAGoldenCase) {
  std::string expected;
  const auto dir = std::filesystem::path(EVTC_TEST_DATA_DIR) / "golden/passes/fold_activations";
  for (const auto& f : std::filesystem::directory_iterator(dir))
    if (f.path().extension() == ".expected") {
      std::ifstream in(f.path());
      expected += std::string(std::istreambuf_iterator<char>(in), {});
    }
  for (const passes::ActivationRuleInfo& rule : passes::activation_rules()) {
    const std::string op = " = " + std::string(op_info(rule.native).name) + " %";
    EXPECT_NE(expected.find(op), std::string::npos)
        << "no golden case folds '" << rule.spelling << "' into " << op_info(rule.native).name;
  }
}
