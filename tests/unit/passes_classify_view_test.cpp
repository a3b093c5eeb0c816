// classify_view: every boundary of the view table.
#include <gtest/gtest.h>

#include "evtc/graph.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/passes.hpp"

using namespace evtc;

namespace {

constexpr int64_t M = 128, N = 256;

LoadClass classify(OperandView v, int64_t m = M, int64_t n = N, std::string* why = nullptr) {
  return classify_view(v, m, n, why);
}

std::string why_not(OperandView v, int64_t m = M, int64_t n = N) {
  std::string why;
  EXPECT_EQ(classify_view(v, m, n, &why), LoadClass::not_fusable);
  return why;
}

}  // namespace

TEST(PassClassifyView, ExactRowMajorMatrixIsAux) {
  EXPECT_EQ(classify({M, N, N, 1}), LoadClass::aux_row_major);
}

TEST(PassClassifyView, ExactColumnMajorMatrixIsColumnMajorAux) {
  EXPECT_EQ(classify({M, N, 1, M}), LoadClass::aux_col_major);
}

TEST(PassClassifyView, BroadcastStridesMakeVectorsAndScalars) {
  EXPECT_EQ(classify({M, N, 0, 1}), LoadClass::row_vec);  // expand of a [n] tensor
  EXPECT_EQ(classify({M, N, 1, 0}), LoadClass::col_vec);  // expand of a [m,1] tensor
  EXPECT_EQ(classify({M, N, 0, 0}), LoadClass::scalar);   // expand of a 0-d tensor
}

TEST(PassClassifyView, LeadingBroadcastShapeIsARowVector) {
  // A 1xN tensor broadcast over M: its row stride is irrelevant.
  EXPECT_EQ(classify({1, N, N, 1}), LoadClass::row_vec);
  EXPECT_EQ(classify({1, N, 0, 1}), LoadClass::row_vec);
  EXPECT_EQ(classify({1, N, 12345, 1}), LoadClass::row_vec);
}

TEST(PassClassifyView, ColumnShapeIsAColumnVector) {
  // An Mx1 tensor: read once per row, whatever its (unused) column stride.
  EXPECT_EQ(classify({M, 1, 1, 1}), LoadClass::col_vec);
  EXPECT_EQ(classify({M, 1, 1, 7}), LoadClass::col_vec);
  EXPECT_EQ(classify({1, 1, 1, 1}), LoadClass::scalar);
}

TEST(PassClassifyView, ExactMatrixVersusColumnVectorVersusLeadingBroadcast) {
  // Same storage stride pattern, three shapes: the shape decides.
  EXPECT_EQ(classify({M, N, N, 1}), LoadClass::aux_row_major);
  EXPECT_EQ(classify({M, 1, N, 1}), LoadClass::not_fusable);  // rows N apart: strided column
  EXPECT_EQ(classify({M, 1, 1, 1}), LoadClass::col_vec);
  EXPECT_EQ(classify({1, N, N, 1}), LoadClass::row_vec);
}

TEST(PassClassifyView, IndexOrderMismatchIsNotFusable) {
  // Strides of an NxM row-major matrix read as MxN (a transpose of the wrong extent), and a
  // column-major stride with the wrong leading dimension.
  EXPECT_EQ(why_not({M, N, 1, N}),
            "the 128x256 view with strides (1, 256) is neither a contiguous row-major (256, 1) "
            "nor a contiguous column-major (1, 128) 128x256 matrix");
  EXPECT_EQ(why_not({M, N, M, 1}),
            "the 128x256 view with strides (128, 1) is neither a contiguous row-major (256, 1) "
            "nor a contiguous column-major (1, 128) 128x256 matrix");
}

TEST(PassClassifyView, PaddedLeadingDimensionIsNotFusable) {
  EXPECT_EQ(classify({M, N, N + 8, 1}), LoadClass::not_fusable);
  EXPECT_EQ(classify({M, N, 1, M + 8}), LoadClass::not_fusable);
}

TEST(PassClassifyView, StridedVectorsAreNotFusable) {
  EXPECT_EQ(why_not({M, N, 0, 2}),
            "the 128x256 view with strides (0, 2) is a row vector whose elements are 2 apart; "
            "a fused row vector must be contiguous");
  EXPECT_EQ(why_not({M, N, 3, 0}),
            "the 128x256 view with strides (3, 0) is a column vector whose elements are 3 "
            "apart; a fused column vector must be contiguous");
}

TEST(PassClassifyView, WrongGlobalShapeIsNotFusable) {
  EXPECT_EQ(why_not({64, N, N, 1}),
            "the 64x256 view with strides (256, 1) does not broadcast to the 128x256 output");
  EXPECT_EQ(why_not({M, N + 1, N + 1, 1}),
            "the 128x257 view with strides (257, 1) does not broadcast to the 128x256 output");
  EXPECT_EQ(classify({N, M, M, 1}), LoadClass::not_fusable);  // transposed extents
}

TEST(PassClassifyView, EmptyViewIsNotFusable) {
  EXPECT_EQ(why_not({0, N, N, 1}), "the 0x256 view with strides (256, 1) has no elements");
}

TEST(PassClassifyView, UnknownSizesUseTheViewsOwn) {
  EXPECT_EQ(classify({64, 32, 32, 1}, 0, 0), LoadClass::aux_row_major);
  EXPECT_EQ(classify({64, 32, 1, 64}, 0, 0), LoadClass::aux_col_major);
  EXPECT_EQ(classify({64, 32, 1, 64}, 0, N), LoadClass::not_fusable);  // cols 32 != N
  EXPECT_EQ(classify({1, 32, 0, 1}, 0, 0), LoadClass::row_vec);
  EXPECT_EQ(classify({64, 1, 1, 0}, M, 0), LoadClass::not_fusable);  // rows 64 != M
}

TEST(PassClassifyView, SquareProblemsStillTellLayoutsApart) {
  EXPECT_EQ(classify({64, 64, 64, 1}, 64, 64), LoadClass::aux_row_major);
  EXPECT_EQ(classify({64, 64, 1, 64}, 64, 64), LoadClass::aux_col_major);
}

TEST(PassClassifyView, WhyIsOnlyWrittenWhenNotFusable) {
  std::string why = "untouched";
  EXPECT_EQ(classify({M, N, N, 1}, M, N, &why), LoadClass::aux_row_major);
  EXPECT_EQ(why, "untouched");
}

TEST(PassClassifyLoads, RewritesOnlyAuxOperandsWithViews) {
  Graph g;
  auto acc = g.accum();
  auto v = acc * g.aux("s", DType::f32) + g.aux("b", DType::bf16);
  v = v * g.aux("free", DType::bf16) + g.row_vec("bias", DType::bf16);
  g.store("D", v, DType::bf16);
  PipelineOptions o;
  o.gemm.m = M;
  o.gemm.n = N;
  o.views["s"] = {M, N, 0, 0};
  o.views["b"] = {M, N, 1, 0};
  o.views["bias"] = {M, N, 7, 7};  // not an aux operand: its view is not used here
  const Graph after = find_pass("classify_loads")->run(g, o);
  EXPECT_EQ(print(after),
            "%0 = accum : f32[m,n]\n"
            "%1 = param_ptr s : f32\n"
            "%2 = mul %0, %1 : f32[m,n]\n"
            "%3 = col_vec b : bf16[m]\n"
            "%4 = add %2, %3 : f32[m,n]\n"
            "%5 = aux free : bf16[m,n]\n"
            "%6 = mul %4, %5 : f32[m,n]\n"
            "%7 = row_vec bias : bf16[n]\n"
            "%8 = add %6, %7 : f32[m,n]\n"
            "%9 = store D %8 : bf16[m,n]\n");
}

TEST(PassClassifyLoads, ScaledMmRowwiseScalesBecomeBroadcastsOfAnFp8Gemm) {
  // torch._scaled_mm(a, b, scale_a, scale_b) with row-wise scales: scale_a is (M,1) and
  // scale_b (1,N), handed over as [m,n] operands with those views. They must become a column
  // vector (one value per row) and a row vector, and the fp8 GEMM must stay fusable.
  Graph g;
  auto v = g.accum() * g.aux("scale_a", DType::f32) * g.aux("scale_b", DType::f32);
  g.store("D", v, DType::bf16);
  PipelineOptions o;
  o.gemm.m = M;
  o.gemm.n = N;
  o.gemm.k = 512;
  o.gemm.a_dtype = o.gemm.b_dtype = DType::f8e4m3;
  o.views["scale_a"] = {M, 1, 1, 1};
  o.views["scale_b"] = {1, N, N, 1};
  Legality legal;
  o.legality = &legal;
  const std::string after = print(run_pipeline(g, o));
  EXPECT_TRUE(legal.reasons.empty()) << legal.reasons.front();
  EXPECT_NE(after.find("col_vec scale_a : f32[m]"), std::string::npos) << after;
  EXPECT_NE(after.find("row_vec scale_b : f32[n]"), std::string::npos) << after;
  EXPECT_EQ(after.find("aux "), std::string::npos) << after;
}
