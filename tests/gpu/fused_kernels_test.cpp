// Numerics of fused kernels against the fp64 reference: every op, every load kind, C present
// and absent, all A/B layouts, D dtypes, multiple outputs, reductions, sizes that are not
// tile multiples, and the fallback path.
#include <gtest/gtest.h>

#include "evtc/expression.hpp"
#include "gpu_suite.hpp"

using evtc::ExecutionPath;
using evtc::gpu_test::expect_matches_reference;
using evtc::gpu_test::kernel;

TEST(FusedOps, UnaryOpsRowVecColVecScalarsBf16) {
  expect_matches_reference(kernel("unary_a"), 1000, 1016, 4096, 11, ExecutionPath::fused);
}

TEST(FusedOps, BinaryTernaryOpsAuxAndCF16ColumnMajorA) {
  expect_matches_reference(kernel("ops_b"), 1000, 1016, 4096, 12, ExecutionPath::fused);
}

TEST(FusedOps, F32OutputBothOperandsColumnMajor) {
  expect_matches_reference(kernel("w1_f32_out"), 1000, 1016, 4096, 13, ExecutionPath::fused);
}

TEST(FusedOps, BiasSiluRowMajorBAtTileMultiples) {
  expect_matches_reference(kernel("w1"), 4096, 4096, 4096, 14, ExecutionPath::fused);
}

TEST(FusedOps, SmallAndSkinnyProblems) {
  expect_matches_reference(kernel("w1"), 8, 24, 64, 15, ExecutionPath::fused);
  expect_matches_reference(kernel("w1"), 1, 4104, 136, 16, ExecutionPath::fused);
  expect_matches_reference(kernel("w1"), 4100, 8, 520, 17, ExecutionPath::fused);
}

TEST(FusedConfigs, PingPongSchedule) {
  expect_matches_reference(kernel("w1_pingpong"), 1000, 1016, 4096, 18, ExecutionPath::fused);
}

TEST(FusedConfigs, StreamKSchedulerWithClusterAlongN) {
  expect_matches_reference(kernel("w1_streamk"), 1000, 1016, 4096, 19, ExecutionPath::fused);
  expect_matches_reference(kernel("w1_streamk"), 264, 512, 8192, 20, ExecutionPath::fused);
}

TEST(FusedReductions, EveryAxisAndOpWithMainOutput) {
  expect_matches_reference(kernel("reductions"), 1000, 1016, 4096, 21, ExecutionPath::fused);
  // M=332: a non-tile multiple that keeps the f32 column vector 16-byte aligned.
  expect_matches_reference(kernel("reductions"), 332, 136, 72, 22, ExecutionPath::fused);
}

TEST(FusedReductions, BceLossWithoutMainOutput) {
  expect_matches_reference(kernel("bce_loss"), 1000, 1016, 1024, 23, ExecutionPath::fused);
}

TEST(Fallback, KNotMultipleOf8RunsUnfusedAndMatches) {
  EXPECT_EQ(kernel("unary_a").fallback_reason(1000, 1016, 1001).rfind(
                "K=1001 is not a multiple of 8 (bf16 A needs 16-byte rows)", 0),
            0u);
  expect_matches_reference(kernel("unary_a"), 1000, 1016, 1001, 31, ExecutionPath::fallback);
}

TEST(Fallback, ReductionOutputsInNarrowDtypes) {
  evtc::CompileOptions o;
  o.disable_fusion = true;
  evtc::ParseOptions p;
  evtc::Kernel k(evtc::parse_expression("input s: bf16\nf = acc * s\nout D: bf16 = f\n"
                                        "out r: bf16 = row_max(f)\nout c: f16 = col_sum(f)\n"
                                        "out t: bf16 = amax(f)",
                                        p),
                 o);
  expect_matches_reference(k, 1000, 1016, 256, 33, ExecutionPath::fallback);
}

TEST(Fallback, EveryOpAndReductionUnfused) {
  for (const char* name : {"ops_b", "reductions", "bce_loss"}) {
    evtc::CompileOptions o = kernel(name).options();
    o.disable_fusion = true;
    evtc::Kernel unfused(kernel(name).graph(), o);
    SCOPED_TRACE(name);
    expect_matches_reference(unfused, 1000, 1016, 256, 32, ExecutionPath::fallback);
  }
}
