// check_legality: one test per rule, asserting the reason's exact text.
#include <gtest/gtest.h>

#include "evtc/arch.hpp"
#include "evtc/expression.hpp"
#include "evtc/graph.hpp"
#include "evtc/kernel_config.hpp"
#include "evtc/passes.hpp"

using namespace evtc;

namespace {

// D: bf16 = acc, on a GEMM that is fusable as it stands.
Graph plain_graph() {
  Graph g;
  g.store("D", g.accum(), DType::bf16);
  return g;
}

GemmDesc aligned_gemm() {
  GemmDesc d;
  d.m = 256;
  d.n = 512;
  d.k = 1024;
  return d;
}

std::vector<std::string> reasons(const Graph& g, const GemmDesc& gemm,
                                 const std::map<std::string, OperandView>& views = {}) {
  return check_legality(g, gemm, views).reasons;
}

using Reasons = std::vector<std::string>;

}  // namespace

TEST(PassLegality, AlignedBf16GemmIsFusable) {
  EXPECT_TRUE(check_legality(plain_graph(), aligned_gemm()).fusable());
}

TEST(PassLegality, UnknownSizesAreNotChecked) {
  Graph g;
  auto acc = g.accum();
  g.store("D", acc + g.row_vec("bias", DType::bf16) + g.col_vec("s", DType::f32), DType::bf16);
  EXPECT_TRUE(check_legality(g, GemmDesc{}).fusable());
}

TEST(PassLegality, SixteenBitAAndBNeedKMultipleOf8) {
  GemmDesc d = aligned_gemm();
  d.k = 1001;
  EXPECT_EQ(reasons(plain_graph(), d),
            (Reasons{"K=1001 is not a multiple of 8 (bf16 A needs 16-byte rows)",
                     "K=1001 is not a multiple of 8 (bf16 B needs 16-byte columns)"}));
}

TEST(PassLegality, MMajorANeedsMMultipleOf8) {
  GemmDesc d = aligned_gemm();
  d.a_dtype = d.b_dtype = DType::f16;
  d.a_layout = Layout::col_major;
  d.m = 1001;
  EXPECT_EQ(reasons(plain_graph(), d),
            (Reasons{"M=1001 is not a multiple of 8 (f16 A is column-major and needs 16-byte "
                     "columns)"}));
}

TEST(PassLegality, NMajorBNeedsNMultipleOf8) {
  GemmDesc d = aligned_gemm();
  d.b_layout = Layout::row_major;
  d.n = 1004;
  EXPECT_EQ(reasons(plain_graph(), d),
            (Reasons{"N=1004 is not a multiple of 8 (bf16 B is row-major and needs 16-byte rows)",
                     "N=1004 is not a multiple of 8 (bf16 output 'D' needs 16-byte rows)"}));
}

TEST(PassLegality, Fp8NeedsKMultipleOf16) {
  GemmDesc d = aligned_gemm();
  d.a_dtype = DType::f8e4m3;
  d.b_dtype = DType::f8e5m2;
  d.k = 1000;  // a multiple of 8, not of 16
  EXPECT_EQ(reasons(plain_graph(), d),
            (Reasons{"K=1000 is not a multiple of 16 (f8e4m3 A needs 16-byte rows)",
                     "K=1000 is not a multiple of 16 (f8e5m2 B needs 16-byte columns)"}));
}

TEST(PassLegality, Fp8NeedsBothOperandsKMajor) {
  GemmDesc d = aligned_gemm();
  d.a_dtype = d.b_dtype = DType::f8e4m3;
  d.a_layout = Layout::col_major;
  d.b_layout = Layout::row_major;
  EXPECT_EQ(reasons(plain_graph(), d),
            (Reasons{"fp8 A and B must both be K-major (A row-major, B column-major), but A is "
                     "column-major",
                     "fp8 A and B must both be K-major (A row-major, B column-major), but B is "
                     "row-major"}));
}

TEST(PassLegality, SixteenBitOperandsMayBeMNMajor) {
  GemmDesc d = aligned_gemm();
  d.a_layout = Layout::col_major;
  d.b_layout = Layout::row_major;
  EXPECT_TRUE(check_legality(plain_graph(), d).fusable());
}

TEST(PassLegality, TensorCoreInputTypes) {
  GemmDesc d = aligned_gemm();
  d.a_dtype = DType::f32;
  EXPECT_EQ(reasons(plain_graph(), d),
            (Reasons{"A is f32, which sm90 tensor cores do not take (A and B must be f16, bf16, "
                     "f8e4m3 or f8e5m2)"}));
}

TEST(PassLegality, AAndBMustHaveTheSameWidth) {
  GemmDesc d = aligned_gemm();
  d.a_dtype = DType::bf16;
  d.b_dtype = DType::f8e4m3;
  EXPECT_EQ(reasons(plain_graph(), d),
            (Reasons{"A is bf16 (16-bit) and B is f8e4m3 (8-bit): A and B must have the same "
                     "width"}));
}

TEST(PassLegality, SixteenBitAAndBMustBeOneType) {
  GemmDesc d = aligned_gemm();
  d.a_dtype = DType::bf16;
  d.b_dtype = DType::f16;
  EXPECT_EQ(reasons(plain_graph(), d),
            (Reasons{"A is bf16 and B is f16: 16-bit A and B must be the same type"}));
}

TEST(PassLegality, MixedFp8FormatsAreFine) {
  GemmDesc d = aligned_gemm();
  d.a_dtype = DType::f8e5m2;
  d.b_dtype = DType::f8e4m3;
  EXPECT_TRUE(check_legality(plain_graph(), d).fusable());
}

TEST(PassLegality, OutputRowsNeedSixteenBytes) {
  GemmDesc d = aligned_gemm();
  d.n = 1020;  // a multiple of 4 (f32) but not of 8 (bf16) or 16 (fp8)
  Graph g;
  auto acc = g.accum();
  g.store("D", acc, DType::bf16);
  g.store("F", acc, DType::f32);
  g.store("Q", cast(acc, DType::f8e4m3), DType::f8e4m3);
  EXPECT_EQ(reasons(g, d),
            (Reasons{"N=1020 is not a multiple of 8 (bf16 output 'D' needs 16-byte rows)",
                     "N=1020 is not a multiple of 16 (f8e4m3 output 'Q' needs 16-byte rows)"}));
}

TEST(PassLegality, Fp8OutputIsAllowed) {
  Graph g;
  g.store("D", g.accum(), DType::f8e4m3);
  EXPECT_TRUE(check_legality(g, aligned_gemm()).fusable());
}

TEST(PassLegality, ColumnMajorOutputIsRefused) {
  GemmDesc d = aligned_gemm();
  d.m = 1001;
  Graph g;
  g.store("D", g.accum(), DType::bf16, Layout::col_major);
  EXPECT_EQ(reasons(g, d),
            (Reasons{"M=1001 is not a multiple of 8 (column-major bf16 output 'D' needs 16-byte "
                     "columns)",
                     "output 'D' is column-major, and evtc's fused kernels store row-major outputs "
                     "only"}));
}

TEST(PassLegality, ReductionOutputsHaveNoAlignmentRule) {
  GemmDesc d = aligned_gemm();
  d.m = 1001;
  d.n = 1001;
  d.a_layout = Layout::row_major;
  Graph g;
  auto acc = g.accum();
  g.store("rows", g.reduce(ReduceAxis::row, ReduceOp::sum, acc), DType::f32);
  g.store("cols", g.reduce(ReduceAxis::col, ReduceOp::max, acc), DType::bf16);
  EXPECT_TRUE(check_legality(g, d).fusable());
}

TEST(PassLegality, VectorOperandsNeedAlignedLengths) {
  GemmDesc d = aligned_gemm();
  d.m = 1002;  // a multiple of 2, not of 4 or 8
  d.n = 1003;
  d.a_dtype = d.b_dtype = DType::f16;
  d.a_layout = Layout::row_major;
  Graph g;
  auto acc = g.accum();
  auto v = acc + g.row_vec("bias", DType::bf16);
  v = v * g.col_vec("scale", DType::f32);
  g.store("D", v, DType::f32);
  EXPECT_EQ(reasons(g, d),
            (Reasons{"N=1003 is not a multiple of 8 (bf16 row vector 'bias' needs 16-byte "
                     "alignment)",
                     "M=1002 is not a multiple of 4 (f32 column vector 'scale' needs 16-byte "
                     "alignment)",
                     "N=1003 is not a multiple of 4 (f32 output 'D' needs 16-byte rows)"}));
}

TEST(PassLegality, MatrixOperandsNeedAlignedRowsOrColumns) {
  GemmDesc d = aligned_gemm();
  d.m = 100;   // a multiple of 4, not of 8
  d.n = 1000;  // a multiple of 8, not of 16
  Graph g;
  auto acc = g.accum();
  auto v = acc + g.aux("res", DType::f8e4m3);
  v = v + g.aux("res_t", DType::bf16, Layout::col_major);
  v = v + g.source(DType::f8e5m2);
  g.store("D", v, DType::bf16);
  EXPECT_EQ(reasons(g, d),
            (Reasons{"N=1000 is not a multiple of 16 (f8e4m3 operand 'res' needs 16-byte rows)",
                     "M=100 is not a multiple of 8 (column-major bf16 operand 'res_t' needs "
                     "16-byte columns)",
                     "N=1000 is not a multiple of 16 (f8e5m2 source C needs 16-byte rows)"}));
}

TEST(PassLegality, AtMostSixteenReductions) {
  Graph g;
  auto acc = g.accum();
  g.store("D", acc, DType::bf16);
  for (int i = 0; i < 17; ++i)
    g.store("r" + std::to_string(i), g.reduce(ReduceAxis::row, ReduceOp::sum, acc * double(i + 1)),
            DType::f32);
  EXPECT_EQ(reasons(g, aligned_gemm()),
            (Reasons{"the epilogue has 17 reduction outputs; at most 16 can be fused"}));
}

TEST(PassLegality, AtMostEightOutputs) {
  Graph g;
  auto acc = g.accum();
  for (int i = 0; i < 9; ++i) g.store("out" + std::to_string(i), acc * double(i), DType::bf16);
  EXPECT_EQ(reasons(g, aligned_gemm()),
            (Reasons{"the epilogue has 9 [m,n] outputs; at most 8 can be fused"}));
  Graph eight;
  auto acc8 = eight.accum();
  for (int i = 0; i < 8; ++i) eight.store("out" + std::to_string(i), acc8 * double(i), DType::bf16);
  EXPECT_TRUE(check_legality(eight, aligned_gemm()).fusable());
}

TEST(PassLegality, UnclassifiableViewIsRefusedWithItsReason) {
  Graph g;
  g.store("D", g.accum() * g.aux("gate", DType::bf16), DType::bf16);
  const GemmDesc d = aligned_gemm();
  EXPECT_EQ(reasons(g, d, {{"gate", OperandView{256, 512, 1, 512}}}),
            (Reasons{"operand 'gate' cannot be fused: the 256x512 view with strides (1, 512) is "
                     "neither a contiguous row-major (512, 1) nor a contiguous column-major (1, "
                     "256) 256x512 matrix"}));
  // A view that classifies is no reason, and the two-argument form ignores views.
  EXPECT_TRUE(check_legality(g, d, {{"gate", OperandView{256, 512, 512, 1}}}).fusable());
  EXPECT_TRUE(check_legality(g, d).fusable());
}

TEST(PassLegality, FusedArchitecturesAndWhatEachFuses) {
  GemmDesc d = aligned_gemm();
  d.sm = 75;
  EXPECT_EQ(reasons(plain_graph(), d),
            (Reasons{"the target architecture is sm_75 (the GPU's, or CompileOptions::arch / EVTC_ARCH): "
                     "evtc generates fused kernels for sm_80/86/89 (Ampere-class), sm_90a (Hopper) and sm_100a / "
                     "sm_120a (Blackwell) only"}));
  // The sm_80 backend (80, 86, 89): 16-bit GEMMs with every epilogue, [m,n] operands row-major.
  for (int arch : {80, 86, 89}) {
    d.sm = arch;
    EXPECT_TRUE(reasons(plain_graph(), d).empty()) << arch;
    EXPECT_TRUE(reasons(parse_expression("out y: bf16 = swiglu(acc)"), d).empty()) << arch;
    EXPECT_TRUE(reasons(parse_expression("out D: bf16 = acc * r[m,n]; out s = row_sum(acc); out t = amax(acc)"), d)
                    .empty())
        << arch;
  }
  d.sm = 86;
  EXPECT_EQ(reasons(parse_expression("input r[m,n]: bf16 col_major\nout D: bf16 = acc * r[m,n]"), d),
            (Reasons{"the sm_86 backend (Ampere-class, sm_80 code) does not fuse column-major [m,n] operands ('r': its "
                     "epilogue reads them in 16-byte vectors along N; pass it row-major)"}));
  GemmDesc ampere_fp8 = d;
  ampere_fp8.a_dtype = ampere_fp8.b_dtype = DType::f8e4m3;
  ampere_fp8.b_layout = Layout::col_major;
  EXPECT_EQ(reasons(plain_graph(), ampere_fp8),
            (Reasons{"the sm_86 backend (Ampere-class, sm_80 code) does not fuse fp8 A and B"}));
  d.sm = 90;
  EXPECT_TRUE(reasons(plain_graph(), d).empty());
  // sm_100a: bf16, [m,n] operands, gated outputs and reductions fuse, with and without D.
  d.sm = 100;
  EXPECT_TRUE(reasons(plain_graph(), d).empty());
  EXPECT_TRUE(reasons(parse_expression("out D: bf16 = acc * gate[m,n]; out P: f32 = relu(acc)"), d).empty());
  EXPECT_TRUE(reasons(parse_expression("out y: bf16 = swiglu(acc)"), d).empty());
  EXPECT_TRUE(reasons(parse_expression("out D: bf16 = acc; out r = row_sum(acc); out c = col_max(acc)"), d).empty());
  EXPECT_TRUE(reasons(parse_expression("out t = sum(acc * C)"), d).empty());
  GemmDesc bw = d;
  bw.a_dtype = bw.b_dtype = DType::f8e4m3;
  bw.b_layout = Layout::col_major;
  bw.fp8_blockwise = true;
  EXPECT_EQ(reasons(plain_graph(), bw),
            (Reasons{"the sm_100a backend (Blackwell B200/GB200) does not fuse block-scaled fp8 (fp8_blockwise)"}));
  // sm_120: fp8 through the sm_120a backend; 16-bit GEMMs through the sm_80 backend, which fuses
  // [m,n] operands, gated outputs and reductions.
  d.sm = 120;
  EXPECT_TRUE(reasons(plain_graph(), d).empty());
  EXPECT_TRUE(reasons(parse_expression("out y: bf16 = swiglu(acc); out D: bf16 = acc * r[m,n]; out s = sum(acc)"), d)
                  .empty());
  EXPECT_EQ(backend_features(120, DType::bf16).backend, 80);
  EXPECT_EQ(backend_features(120, DType::f8e4m3).backend, 120);
  GemmDesc fp8 = bw;
  fp8.sm = 120;
  fp8.fp8_blockwise = false;
  EXPECT_TRUE(reasons(parse_expression("out D: bf16 = acc * s[m] * t[n]"), fp8).empty());
  EXPECT_EQ(reasons(parse_expression("out D: bf16 = acc * r[m,n]"), fp8),
            (Reasons{"the sm_120a backend (Blackwell RTX 50xx / RTX PRO 6000) does not fuse [m,n] operands ('r')"}));
  EXPECT_TRUE(reasons(parse_expression("out y: bf16 = swiglu(acc); out r = row_sum(acc); out t = sum(acc * C)"), fp8)
                  .empty());
  EXPECT_EQ(reasons(parse_expression("out D: bf16 = acc; out P: f32 = relu(acc)"), fp8),
            (Reasons{"the sm_120a backend (Blackwell RTX 50xx / RTX PRO 6000) does not fuse [m,n] outputs besides "
                     "the main one ('P')"}));
}

TEST(PassLegality, ConfigurationsOfEachArchitecture) {
  GemmDesc d = aligned_gemm();
  d.sm = 100;
  const KernelConfig coop = *KernelConfig::parse("coop_128x256x64_c2x1_persistent");
  EXPECT_EQ(config_refusal(coop, d), "");
  EXPECT_NE(config_refusal(*KernelConfig::parse("pingpong_128x128x64_c1x1_persistent"), d)
                .find("is ping-pong, which sm_100a kernels do not have"),
            std::string::npos);
  // 256-row tiles are the two-SM MMA, on a cluster of an even M.
  EXPECT_EQ(config_refusal(*KernelConfig::parse("coop_256x128x64_c2x1_persistent"), d), "");
  EXPECT_NE(config_refusal(*KernelConfig::parse("coop_256x128x64_c1x1_persistent"), d).find("cluster's M must be even"),
            std::string::npos);
  KernelConfig odd = coop;  // not a name KernelConfig::parse takes, but a C++ caller can build it
  odd.tile_m = 192;
  EXPECT_NE(config_refusal(odd, d).find("64 or 128 rows on one SM, 256 on two"), std::string::npos);
  EXPECT_NE(config_refusal(*KernelConfig::parse("coop_128x256x64_c2x1_streamk"), d).find("stream-K"),
            std::string::npos);
  // Widths between 64, 128, 192 and 256, and split-K, are Hopper's.
  EXPECT_NE(config_refusal(*KernelConfig::parse("coop_128x96x64_c1x1_persistent"), d)
                .find("96-column tiles; sm_100a kernels take 64, 128, 192 or 256 columns"),
            std::string::npos);
  EXPECT_NE(config_refusal(*KernelConfig::parse("coop_128x128x64_c1x1_splitk2"), d).find("split-K"), std::string::npos);
  GemmDesc hopper = aligned_gemm();
  EXPECT_EQ(config_refusal(*KernelConfig::parse("coop_128x96x64_c1x1_persistent"), hopper), "");
  EXPECT_EQ(config_refusal(*KernelConfig::parse("coop_128x128x64_c1x1_splitk2"), hopper), "");
  d.sm = 120;
  d.a_dtype = d.b_dtype = DType::f8e4m3;
  EXPECT_NE(config_refusal(coop, d).find("run without clusters (1×1)"), std::string::npos);
  EXPECT_NE(config_refusal(*KernelConfig::parse("coop_128x128x128_c1x1_persistent_fastacc"), d).find("_fastacc"),
            std::string::npos);
  // The defaults: one-SM 128×256 on sm_100a, 128×128×128 without a cluster on sm_120a.
  EXPECT_EQ(default_config(plain_graph(), d).name(), "coop_128x128x128_c1x1_persistent");
  d.sm = 100;
  d.a_dtype = d.b_dtype = DType::bf16;
  EXPECT_EQ(default_config(plain_graph(), d).name(), "coop_128x256x64_c1x1_persistent");
  // [m,n] operands or outputs besides D: 128×128 (a 128×256 tile left no main-loop stage).
  EXPECT_EQ(default_config(parse_expression("out D: bf16 = acc * gate[m,n]"), d).name(),
            "coop_128x128x64_c1x1_persistent");
}

TEST(PassLegality, ThePipelinePassReportsAndLeavesTheGraph) {
  Graph g;
  g.store("D", g.accum() * g.aux("gate", DType::bf16), DType::bf16);
  PipelineOptions o;
  o.gemm = aligned_gemm();
  o.gemm.k = 1001;
  o.views["gate"] = OperandView{256, 512, 2, 1};
  Legality verdict;
  o.legality = &verdict;
  const PassInfo* pass = find_pass("legality");
  ASSERT_NE(pass, nullptr);
  const Graph after = pass->run(g, o);
  EXPECT_EQ(verdict.reasons, check_legality(g, o.gemm, o.views).reasons);
  EXPECT_EQ(verdict.reasons.size(), 3u);
  o.legality = nullptr;
  EXPECT_NO_THROW(pass->run(g, o));
  EXPECT_EQ(after.size(), g.size());
}
