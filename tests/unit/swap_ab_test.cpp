// Swap-AB (evtc::swap_ab, KernelConfig::swap_ab): the transposed problem computes the same
// outputs. Checked with the fp64 reference on random epilogues (the transposed graph on the
// transposed inputs gives the transposed outputs), plus the refusals, the configuration names
// and what the emitter makes of a transposed configuration. tests/golden/passes/swap_ab holds
// the pass's golden cases.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "backends/emit.hpp"
#include "evtc/arch.hpp"
#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/kernel_config.hpp"
#include "evtc/passes.hpp"
#include "evtc/reference.hpp"
#include "evtc/runtime.hpp"
#include "testing/random_epilogue.hpp"

using namespace evtc;

namespace {

std::vector<double> transposed(const std::vector<double>& x, int64_t rows, int64_t cols) {
  std::vector<double> t(x.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[size_t(j * rows + i)] = x[size_t(i * cols + j)];
  return t;
}

// The transposed problem's inputs: A' = Bᵀ, B' = Aᵀ, C and [m,n] operands transposed, vectors
// and scalars as they are.
ReferenceInputs transposed_inputs(const Graph& g, const ReferenceInputs& in) {
  ReferenceInputs t;
  t.m = in.n;
  t.n = in.m;
  t.k = in.k;
  t.a = transposed(in.b, in.k, in.n);
  t.b = transposed(in.a, in.m, in.k);
  if (!in.c.empty()) t.c = transposed(in.c, in.m, in.n);
  for (const auto& [name, values] : in.operands) {
    bool full = false;
    for (const Node& n : g.nodes()) full |= n.kind == NodeKind::aux && n.name == name;
    t.operands[name] = full ? transposed(values, in.m, in.n) : values;
  }
  return t;
}

TEST(SwapAB, TransposedProblemGivesTransposedOutputs) {
  evtc::testing::GeneratorOptions o;
  o.gated_share = 0;  // refused: gated values pair adjacent columns
  o.fp8_share = 0.2;
  evtc::testing::EpilogueGenerator gen(11, o);
  int checked = 0;
  for (int i = 0; i < 60; ++i) {
    const evtc::testing::RandomKernel k = gen.next();
    ParseOptions p;
    p.operand_dtype = k.kind == evtc::testing::KernelKind::fp8 ? DType::f32 : k.gemm.a_dtype;
    const Graph g = run_pipeline(parse_expression(k.text(), p));
    ASSERT_EQ(swap_ab_refusal(g, k.gemm), "") << k.text();
    const SwappedProblem s = swap_ab(g, k.gemm);
    // Sizes that are no tile's multiples, and M ≠ N so that a transposition slip shows.
    const int64_t m = 7, n = 13, kk = 24;
    const ReferenceInputs in = random_reference_inputs(g, m, n, kk, k.gemm.a_dtype, k.gemm.b_dtype, 100 + i);
    const ReferenceOutputs want = evaluate_reference(g, in);
    const ReferenceOutputs got = evaluate_reference(s.graph, transposed_inputs(g, in));
    ASSERT_EQ(got.size(), want.size());
    for (NodeId id : g.outputs()) {
      const Node& out = g.node(id);
      const bool full = out.shape == Shape::full;
      const std::vector<double>& w = want.at(out.name);
      const std::vector<double> o2 = full ? transposed(got.at(out.name), n, m) : got.at(out.name);
      ASSERT_EQ(o2.size(), w.size()) << out.name << " of " << k.text();
      for (size_t e = 0; e < w.size(); ++e) {
        if (std::isnan(w[e])) {
          EXPECT_TRUE(std::isnan(o2[e])) << out.name << "[" << e << "] of " << k.text();
          continue;
        }
        // The same terms in the same order, except that a reduction adds its elements in the
        // other order: one rounding of the output's dtype at most.
        EXPECT_NEAR(o2[e], w[e], 1e-2 * (1 + std::abs(w[e]))) << out.name << "[" << e << "] of " << k.text();
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 60);
}

TEST(SwapAB, IsAnInvolution) {
  const Graph g = run_pipeline(parse_expression(
      "out D: bf16 = silu(acc * s[m] + bias[n]) + res[m,n]\nout r: f32 = row_sum(acc)\nout c: f32 = col_max(acc)"));
  GemmDesc gemm{.m = 40, .n = 3000, .k = 256, .a_dtype = DType::bf16, .b_dtype = DType::f16,
                .a_layout = Layout::row_major, .b_layout = Layout::row_major};
  const SwappedProblem once = swap_ab(g, gemm);
  EXPECT_NE(print(once.graph), print(g));
  EXPECT_EQ(once.gemm.m, 3000);
  EXPECT_EQ(once.gemm.n, 40);
  EXPECT_EQ(once.gemm.a_dtype, DType::f16);
  EXPECT_EQ(once.gemm.a_layout, Layout::col_major);  // Bᵀ of a row-major B
  EXPECT_EQ(once.gemm.b_layout, Layout::col_major);  // Aᵀ of a row-major A
  const SwappedProblem back = swap_ab(once.graph, once.gemm);
  EXPECT_EQ(print(back.graph), print(g));
  EXPECT_EQ(back.gemm.m, gemm.m);
  EXPECT_EQ(back.gemm.a_layout, gemm.a_layout);
  EXPECT_EQ(back.gemm.b_layout, gemm.b_layout);
  // The operand tables keep their order: the run path passes the same pointers.
  const KernelSignature a = make_signature(g), b = make_signature(once.graph);
  ASSERT_EQ(a.pointers.size(), b.pointers.size());
  for (size_t i = 0; i < a.pointers.size(); ++i) EXPECT_EQ(a.pointers[i].name, b.pointers[i].name);
  EXPECT_EQ(a.d_name, b.d_name);
}

TEST(SwapAB, RefusesGatedValuesAndBlockScales) {
  const Graph gated = run_pipeline(parse_expression("out y: bf16 = swiglu(acc)"));
  const GemmDesc gemm{.m = 16, .n = 28672, .k = 4096};
  EXPECT_NE(swap_ab_refusal(gated, gemm).find("gated value"), std::string::npos);
  try {
    swap_ab(gated, gemm);
    ADD_FAILURE() << "a gated epilogue was transposed";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("the GEMM cannot be computed transposed (swap-AB): the gated value", 0), 0u)
        << e.what();
  }
  // A transposed configuration given for it: refused when the kernel is built, naming both.
  CompileOptions o;
  o.arch = 90;
  o.config = KernelConfig::parse("pingpong_64x16x128_c1x1_persistent_swap");
  try {
    Kernel k(parse_expression("out y: bf16 = swiglu(acc)"), o);
    ADD_FAILURE() << "the transposed configuration was accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("configuration pingpong_64x16x128_c1x1_persistent_swap computes the GEMM "
                                          "transposed (swap-AB), which this epilogue cannot take: the gated value",
                                          0),
              0u)
        << e.what();
  }
  const Graph plain = run_pipeline(parse_expression("out D: bf16 = acc"));
  GemmDesc blockwise{.m = 16, .n = 4096, .k = 4096, .a_dtype = DType::f8e4m3, .b_dtype = DType::f8e4m3};
  blockwise.fp8_blockwise = true;
  EXPECT_NE(swap_ab_refusal(plain, blockwise).find("block-scaled"), std::string::npos);
  EXPECT_EQ(swap_ab_refusal(plain, gemm), "");
}

TEST(SwapAB, ConfigurationNames) {
  KernelConfig c = KernelConfig::of(MainloopSchedule::pingpong, 64, 16);
  c.tile_k = 128;
  c.swap_ab = true;
  EXPECT_EQ(c.name(), "pingpong_64x16x128_c1x1_persistent_swap");
  EXPECT_EQ(KernelConfig::parse(c.name()), c);
  auto split = KernelConfig::parse("coop_128x32x64_c1x1_splitk4_swap_precise");
  ASSERT_TRUE(split);
  EXPECT_TRUE(split->swap_ab);
  EXPECT_EQ(split->splits, 4);
  EXPECT_TRUE(split->precise_math);
  EXPECT_FALSE(KernelConfig::parse("coop_128x32x64_c1x1_persistent_swap_swap"));
  EXPECT_EQ(config_refusal(c, GemmDesc{.sm = 90}), "");
  EXPECT_NE(config_refusal(*KernelConfig::parse("coop_128x128x64_c1x1_persistent_swap"), GemmDesc{.sm = 100})
                .find("swap-AB"),
            std::string::npos);
  GemmDesc blockwise{.a_dtype = DType::f8e4m3, .b_dtype = DType::f8e4m3};
  blockwise.fp8_blockwise = true;
  EXPECT_NE(config_refusal(c, blockwise).find("swap-AB"), std::string::npos);
}

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

TEST(SwapAB, EmitsTheTransposedKernel) {
  const Graph g = run_pipeline(parse_expression("out D: bf16 = silu(acc + bias[n]) + C\nout r: f32 = row_sum(acc)"));
  const GemmDesc gemm{.m = 16, .n = 4096, .k = 4096};
  KernelConfig c = KernelConfig::of(MainloopSchedule::pingpong, 64, 16);
  const std::string plain = backend::emit_dense_kernel(g, gemm, c).source;
  c.swap_ab = true;
  const std::string swapped = backend::emit_dense_kernel(g, gemm, c).source;
  // D and C column-major, their leading dimension the second stride.
  EXPECT_TRUE(contains(swapped, "ElementC, cutlass::layout::ColumnMajor")) << swapped;
  EXPECT_TRUE(contains(swapped, "ElementD, cutlass::layout::ColumnMajor"));
  EXPECT_TRUE(contains(swapped, "cute::get<1>(stride_c) = a.ldc;"));
  EXPECT_TRUE(contains(swapped, "cute::get<1>(stride_d) = a.ldd;"));
  EXPECT_TRUE(contains(plain, "cute::get<0>(stride_d) = a.ldd;"));
  // bias[n] is a column broadcast of the transposed tile; the row sum a CUTLASS row reduction.
  EXPECT_TRUE(contains(swapped, "Sm90ColBroadcast"));
  EXPECT_FALSE(contains(swapped, "Sm90RowBroadcast<"));
  EXPECT_TRUE(contains(plain, "Sm90RowBroadcast<"));
  EXPECT_TRUE(contains(swapped, "Sm90RowReduction<"));
  EXPECT_TRUE(contains(plain, "Sm90ColReduction<"));
  EXPECT_TRUE(contains(swapped, "pingpong_64x16x64_c1x1_persistent_swap"));
  // A gated epilogue has no transposed kernel.
  const Graph gated = run_pipeline(parse_expression("out y: bf16 = swiglu(acc)"));
  EXPECT_THROW(backend::emit_dense_kernel(gated, gemm, c), UserError);
}

}  // namespace
