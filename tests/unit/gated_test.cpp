// Gated activations (N -> N/2): the pair nodes gate()/up(), the [m,n/2] shape, the
// expression-language functions, the reference interpreter, legality and both emitters.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>
#include <string>

#include "backends/cuda/fallback_emitter.hpp"
#include "backends/cutlass3/emitter.hpp"
#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/gated.hpp"
#include "evtc/graph.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/kernel_config.hpp"
#include "evtc/passes.hpp"
#include "evtc/reference.hpp"

using namespace evtc;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

Graph parse(const std::string& text) { return parse_expression(text); }

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

TEST(GatedIr, PairNodesHalveTheWidthAndCarryTheirInputsDtype) {
  Graph g;
  Value acc = g.accum();
  Value h = cast(acc, DType::bf16);
  Value gt = gate(h), u = up(h);
  EXPECT_EQ(gt.node().shape, Shape::half);
  EXPECT_EQ(gt.node().dtype, DType::bf16);
  EXPECT_EQ(u.node().part, PairPart::up);
  Value y = silu(gt) * u * g.col_vec("s", DType::f32) * 2.0;
  EXPECT_EQ(y.node().shape, Shape::half);
  EXPECT_EQ(g.node(g.store("y", y, DType::bf16).id).shape, Shape::half);
}

TEST(GatedIr, ShapeErrorsNameTheOperands) {
  Graph g;
  Value acc = g.accum();
  Value bias = g.row_vec("bias", DType::bf16);
  EXPECT_NE(error_of([&] { (void)(gate(acc) + bias); })
                .find("add: 'gate(acc)' is a gated [m,n/2] value but 'bias[n]' is [n]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { (void)(up(acc) * acc); }).find("is a gated [m,n/2] value"),
            std::string::npos);
  EXPECT_NE(error_of([&] { (void)gate(bias); })
                .find("gate('bias[n]'): gate() and up() take an [m,n] value"),
            std::string::npos);
  EXPECT_NE(error_of([&] { (void)gate(gate(acc)); }).find("but this one is [m,n/2]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { (void)g.reduce(ReduceAxis::row, ReduceOp::sum, up(acc)); })
                .find("reductions of gated values are not supported"),
            std::string::npos);
  EXPECT_NE(error_of([&] { (void)g.store("y", gate(acc), DType::bf16, Layout::col_major); })
                .find("output 'y' is a gated [m,n/2] value: it can only be stored row-major"),
            std::string::npos);
}

TEST(GatedIr, CanonicalTextRoundTripsAndHashesPartsApart) {
  const Graph g = parse("h = acc + bias[n]; out y: bf16 = silu(gate(h)) * up(h)");
  const std::string text = print(g);
  EXPECT_NE(text.find("gate %"), std::string::npos) << text;
  EXPECT_NE(text.find(": f32[m,n/2]"), std::string::npos) << text;
  EXPECT_NE(text.find("store y %"), std::string::npos) << text;
  EXPECT_EQ(print(parse_canonical(text)), text);
  // Swapping gate and up is a different graph.
  const Graph swapped = parse("h = acc + bias[n]; out y: bf16 = silu(up(h)) * gate(h)");
  EXPECT_NE(graph_hash(g), graph_hash(swapped));
  EXPECT_NE(error_of([] { (void)parse_canonical("%0 = accum : f32[m,n/3]\n"); }).find("expected [m,n/2]"),
            std::string::npos);
}

TEST(GatedIr, CommonSubexpressionsKeepGateAndUpApart) {
  // gate(h) twice merges; gate(h) and up(h) must not.
  Graph g = parse("h = acc * 2; out y: bf16 = gate(h) * gate(h) + up(h)");
  PipelineOptions o;
  const Graph out = run_pipeline(g, o);
  int gates = 0, ups = 0;
  for (const Node& n : out.nodes())
    if (n.kind == NodeKind::pair) ++(n.part == PairPart::gate ? gates : ups);
  EXPECT_EQ(gates, 1);
  EXPECT_EQ(ups, 1);
}

TEST(GatedFrontend, FunctionsExpandToTheirDefinitions) {
  // swiglu7 is gptoss_swiglu with its defaults, and both are the hand-written form.
  const Graph by_hand = parse(
      "g = min(gate(acc), 7); u = clamp(up(acc), -7, 7); out y: bf16 = g * sigmoid(g * 1.702) * (u + 1)");
  EXPECT_EQ(print(parse("out y: bf16 = swiglu7(acc)")), print(by_hand));
  EXPECT_EQ(print(parse("out y: bf16 = gptoss_swiglu(acc)")), print(by_hand));
  EXPECT_EQ(print(parse("out y: bf16 = gptoss_swiglu(acc, alpha=1.702, limit=7)")), print(by_hand));
  EXPECT_NE(print(parse("out y: bf16 = gptoss_swiglu(acc, 1.5)")), print(by_hand));
  EXPECT_EQ(print(parse("out y: bf16 = swiglu(acc)")),
            print(parse("out y: bf16 = silu(gate(acc)) * up(acc)")));
  EXPECT_EQ(print(parse("out y: bf16 = reglu(acc)")),
            print(parse("out y: bf16 = relu(gate(acc)) * up(acc)")));
  // An operand may still be called gate (W2's gate[m,n]).
  EXPECT_NO_THROW(parse("out D: bf16 = acc * gate[m,n]"));
}

TEST(GatedFrontend, ErrorsPointAtTheCall) {
  EXPECT_NE(error_of([] { parse("out y = swiglu(acc, 2)"); }).find("swiglu takes 1 argument, got 2"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse("out y = gptoss_swiglu(acc, beta=2)"); })
                .find("gptoss_swiglu has no parameter 'beta'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse("out y = gptoss_swiglu(acc, limit=x)"); })
                .find("the parameter limit of gptoss_swiglu must be a number"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse("out y = swiglu(bias[n])"); })
                .find("gate() and up() take an [m,n] value"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse("out y = swiglu(acc) + bias[n]"); })
                .find("is a gated [m,n/2] value but 'bias[n]' is [n]"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse("out y = gptoss_swiglu(acc, limit=5, limit=6)"); })
                .find("the parameter limit of gptoss_swiglu is given twice"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse("out y = swiglu(acc, alpha=1)"); }).find("swiglu has no parameters"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse("out y = swigl(acc)"); }).find("did you mean 'swiglu'?"),
            std::string::npos);
}

TEST(GatedReference, PairsComeFromEvenAndOddColumns) {
  // acc is 2×4: pairs (a0, a1), (a2, a3) per row.
  const Graph g = parse(
      "out y: f32 = swiglu7(acc); out sw: f32 = swiglu(acc); out d: f32 = acc * 1; out gs = "
      "gate(acc) * s[m]");
  ReferenceInputs in;
  in.m = 2;
  in.n = 4;
  in.acc = {1.0, 2.0, 9.0, -8.0,  //
            -3.0, 0.5, 0.25, 10.0};
  in.operands["s"] = {2.0, -1.0};
  const ReferenceOutputs out = evaluate_reference(g, in);
  ASSERT_EQ(out.at("y").size(), 4u);
  ASSERT_EQ(out.at("d").size(), 8u);
  auto swiglu7 = [](double gt, double u) {
    const double gl = std::min(gt, 7.0), ul = std::clamp(u, -7.0, 7.0);
    return gl * sigmoid(1.702 * gl) * (ul + 1.0);
  };
  const double want_y[] = {swiglu7(1, 2), swiglu7(9, -8), swiglu7(-3, 0.5), swiglu7(0.25, 10)};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out.at("y")[i], want_y[i], 1e-6 * (1 + std::fabs(want_y[i])));
  EXPECT_NEAR(out.at("sw")[1], 9 * sigmoid(9) * -8, 1e-5);
  EXPECT_DOUBLE_EQ(out.at("gs")[0], 2.0);
  EXPECT_DOUBLE_EQ(out.at("gs")[1], 18.0);
  EXPECT_DOUBLE_EQ(out.at("gs")[2], 3.0);
  EXPECT_DOUBLE_EQ(out.at("gs")[3], -0.25);
}

TEST(GatedReference, OddNIsAnError) {
  const Graph g = parse("out y: f32 = swiglu(acc)");
  ReferenceInputs in;
  in.m = 1;
  in.n = 3;
  in.acc = {1, 2, 3};
  EXPECT_NE(error_of([&] { (void)evaluate_reference(g, in); })
                .find("problem size n=3 is odd, but the epilogue takes interleaved (gate, up) column pairs"),
            std::string::npos);
}

TEST(GatedLegality, OddNIsRefusedAndNoRowAlignmentIsAsked) {
  const Graph g = parse("out y: bf16 = swiglu(acc)");
  GemmDesc gemm;
  gemm.m = 256;
  gemm.n = 1001;
  gemm.k = 128;
  gemm.b_layout = Layout::col_major;
  Legality l = check_legality(g, gemm);
  ASSERT_FALSE(l.reasons.empty());
  EXPECT_NE(l.reasons[0].find("N=1001 is odd, but the gated output 'y' needs whole (gate, up) column pairs"),
            std::string::npos);
  // N/2 = 501 columns of bf16: not 16-byte rows, but the gated store needs none.
  gemm.n = 1002;
  EXPECT_TRUE(check_legality(g, gemm).reasons.empty());
}

TEST(GatedEmitters, Sm90UsesPairFunctorsAndTheHalfStore) {
  const Graph g = run_pipeline(parse("h = acc + bias[n]; out pre: bf16 = h; out y: bf16 = swiglu(h)"),
                               PipelineOptions{});
  GemmDesc gemm;
  gemm.b_layout = Layout::col_major;
  const auto emitted = cutlass3::emit_kernel(g, gemm, KernelConfig{});
  EXPECT_NE(emitted.source.find("evtc::device::PairGate"), std::string::npos);
  EXPECT_NE(emitted.source.find("evtc::device::PairUp"), std::string::npos);
  EXPECT_NE(emitted.source.find("evtc::device::Sm90HalfStore<cutlass::bfloat16_t"), std::string::npos);
  EXPECT_NE(emitted.source.find("a.n / 2"), std::string::npos);
  EXPECT_EQ(emitted.signature.d_name, "pre");  // the full-width output stays the TMA-stored D
}

TEST(GatedEmitters, FallbackRunsOneThreadPerPair) {
  const Graph g = run_pipeline(parse("h = acc + bias[n]; out pre: bf16 = h; out y: bf16 = swiglu(h)"),
                               PipelineOptions{});
  const std::string src = cuda::emit_fallback_kernel(g, make_signature(g));
  EXPECT_NE(src.find("j0 = 2 * jh, j1 = j0 + 1"), std::string::npos);
  EXPECT_NE(src.find("[i * (n / 2) + jh]"), std::string::npos);
  EXPECT_NE(src.find("const int64_t total = m * (n / 2);"), std::string::npos);
}

TEST(GatedWeights, HostInterleavingOfStackedRowsAndColumns) {
  // I = 3 features, K = 2. col_major: a (2I)×K Linear weight, rows gate0..2 then up0..2.
  std::vector<uint16_t> stacked(12), out(12, 0xffff);
  for (int i = 0; i < 12; ++i) stacked[i] = static_cast<uint16_t>(i);
  interleave_gate_up_host(stacked.data(), out.data(), 3, 2, DType::bf16, Layout::col_major);
  // Row 2j = gate row j (elements 2j, 2j+1), row 2j+1 = up row j (elements 6+2j, 7+2j).
  EXPECT_EQ(out, (std::vector<uint16_t>{0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11}));
  // row_major: K×(2I), each row [g0 g1 g2 u0 u1 u2] -> [g0 u0 g1 u1 g2 u2].
  interleave_gate_up_host(stacked.data(), out.data(), 3, 2, DType::f16, Layout::row_major);
  EXPECT_EQ(out, (std::vector<uint16_t>{0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11}));
  EXPECT_NE(error_of([&] { interleave_gate_up_host(stacked.data(), stacked.data() + 1, 3, 2,
                                                   DType::bf16, Layout::row_major); })
                .find("overlap"),
            std::string::npos);
  EXPECT_NE(error_of([&] { interleave_gate_up_host(stacked.data(), out.data(), 0, 2, DType::bf16,
                                                   Layout::row_major); })
                .find("inter=0 and k=2 must be positive"),
            std::string::npos);
  EXPECT_NE(error_of([&] { interleave_gate_up_host(nullptr, out.data(), 3, 2, DType::bf16,
                                                   Layout::row_major); })
                .find("interleave_gate_up: the stacked weights are a null pointer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { interleave_gate_up_host(stacked.data(), nullptr, 3, 2, DType::bf16,
                                                   Layout::row_major); })
                .find("interleave_gate_up: the output is a null pointer"),
            std::string::npos);
}

// gate = merged[0::2], up = merged[1::2] of one buffer: the merged strides come back, for
// Linear weights (rows interleaved), bias vectors and grouped weights (G x N x K).
TEST(GatedWeights, InterleavedViewsOfOneBufferAreRecognised) {
  using V = std::vector<int64_t>;
  const auto strides = [](V sizes, V g, int64_t go, V u, int64_t uo, int64_t dim) {
    return interleaved_strides(sizes, g, go, u, uo, dim);
  };
  // A (2I = 6, K = 5) buffer: gate rows 0, 2, 4 and up rows 1, 3, 5.
  EXPECT_EQ(strides({3, 5}, {10, 1}, 0, {10, 1}, 5, 0), V({5, 1}));
  EXPECT_EQ(strides({3, 5}, {10, 1}, 0, {10, 1}, 5, -2), V({5, 1}));
  // Bias vectors [0::2] and [1::2], and the same views past a storage offset.
  EXPECT_EQ(strides({4}, {2}, 0, {2}, 1, 0), V({1}));
  EXPECT_EQ(strides({4}, {2}, 7, {2}, 8, -1), V({1}));
  // Grouped: (G = 2, 2I = 4, K = 3) buffer, halves (2, 2, 3) with strides (12, 6, 1).
  EXPECT_EQ(strides({2, 2, 3}, {12, 6, 1}, 0, {12, 6, 1}, 3, 1), V({12, 3, 1}));
  // One feature each: any stride along dim, the step is the offset difference.
  EXPECT_EQ(strides({1, 5}, {99, 1}, 0, {99, 1}, 5, 0), V({5, 1}));

  // Not interleaved: stacked halves [gate; up] (up starts I rows later, gate's stride is K),
  // up before gate, different strides, the wrong step, a dimension out of range.
  EXPECT_FALSE(strides({3, 5}, {5, 1}, 0, {5, 1}, 15, 0));
  EXPECT_FALSE(strides({3, 5}, {10, 1}, 5, {10, 1}, 0, 0));
  EXPECT_FALSE(strides({3, 5}, {10, 1}, 0, {10, 2}, 5, 0));
  EXPECT_FALSE(strides({3, 5}, {10, 1}, 0, {10, 1}, 4, 0));
  EXPECT_FALSE(strides({3, 5}, {10, 1}, 0, {10, 1}, 5, 2));
  EXPECT_FALSE(strides({3, 5}, {10, 1}, 0, {10, 1}, 5, -3));
  EXPECT_FALSE(strides({3, 5}, {10, 1}, 0, {10, 1, 1}, 5, 0));
  EXPECT_FALSE(strides({}, {}, 0, {}, 1, 0));
  // Interleaved, but the merged tensor's last dimension is not contiguous: B would be read
  // with a stride along K (every other element of a row), and vectors with a step of 2.
  EXPECT_FALSE(strides({3, 5}, {20, 2}, 0, {20, 2}, 10, 0));
  EXPECT_FALSE(strides({4}, {4}, 0, {4}, 2, 0));
}
