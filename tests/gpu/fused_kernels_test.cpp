// Numerics of fused kernels against the fp64 reference: every op, every load kind, C present
// and absent, all A/B layouts, D dtypes, multiple outputs, reductions, sizes that are not
// tile multiples, and the fallback path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <thread>
#include <tuple>
#include <vector>

#include <cuda_runtime_api.h>

#include "evtc/arch.hpp"
#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/gated.hpp"
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

TEST(FusedConfigs, TilesOf192ColumnsAtPartialTiles) {
  // 3000 = 15 × 192 + 120 columns, 1999 rows: partial tiles along both axes; the gated kernel's
  // 192-column tile writes 96 output columns (3008 → 1504).
  expect_matches_reference(kernel("w1_coop_256x192"), 1999, 3000, 1000, 26, ExecutionPath::fused);
  expect_matches_reference(kernel("w1_coop_256x192"), 4100, 5000, 520, 27, ExecutionPath::fused);  // several waves
  expect_matches_reference(kernel("swiglu_pingpong_128x192"), 1999, 3008, 1000, 28, ExecutionPath::fused);
  expect_matches_reference(kernel("swiglu_pingpong_128x192"), 4100, 2 * 4004, 264, 29, ExecutionPath::fused);
}

TEST(FusedConfigs, DecodeTilesOfSixteenColumnMultiplesWithClusterAlongN) {
  // 64×48 tiles: 1000 = 20 × 48 + 40 columns (gated: 500 outputs), rows below and above one tile.
  expect_matches_reference(kernel("decode_mix"), 37, 1000, 1000, 61, ExecutionPath::fused);
  expect_matches_reference(kernel("decode_mix"), 200, 2 * 1500, 4104, 62, ExecutionPath::fused);
  expect_matches_reference(kernel("narrow_16"), 16, 2 * 776, 2056, 63, ExecutionPath::fused);
  expect_matches_reference(kernel("narrow_16"), 130, 2 * 100, 520, 64, ExecutionPath::fused);
}

TEST(FusedConfigs, SplitKAndStreamKOfDecodeProblems) {
  // Split four ways: 52 rows, 1000 = 10 × 96 + 40 columns, K not a multiple of the K tile.
  expect_matches_reference(kernel("split_k"), 52, 1000, 4104, 65, ExecutionPath::fused);
  expect_matches_reference(kernel("split_k"), 300, 2224, 1000, 66, ExecutionPath::fused);
  expect_matches_reference(kernel("stream_k_gated"), 64, 2 * 1500, 4096, 67, ExecutionPath::fused);
  expect_matches_reference(kernel("stream_k_gated"), 17, 2 * 520, 11000, 68, ExecutionPath::fused);
}

TEST(FusedConfigs, TransposedKernelsOfDecodeProblems) {
  // Swap-AB: N fills the tiles' rows, M their 16 or 32 columns. Sizes that are no tile's
  // multiples along M, N and K; M from 8 to above a tile's columns (swap_mix's column-major
  // operand needs M a multiple of 8); K split four ways.
  expect_matches_reference(kernel("swap_mix"), 56, 1000, 1000, 81, ExecutionPath::fused);
  expect_matches_reference(kernel("swap_mix"), 8, 2056, 4104, 82, ExecutionPath::fused);
  expect_matches_reference(kernel("swap_mix"), 136, 776, 520, 83, ExecutionPath::fused);
  expect_matches_reference(kernel("swap_split_k"), 20, 1000, 4104, 84, ExecutionPath::fused);
  expect_matches_reference(kernel("swap_split_k"), 64, 4104, 2056, 85, ExecutionPath::fused);
  expect_matches_reference(kernel("swap_fp8"), 16, 1008, 2048, 86, ExecutionPath::fused);
  expect_matches_reference(kernel("swap_fp8"), 40, 4096, 4096, 87, ExecutionPath::fused);
}

TEST(FusedConfigs, KInPartsAddedByASecondKernel) {
  // Four parts of a transposed GEMM and three of an untransposed gated one: M from 8 to above a
  // tile's columns, N and K no tile multiples (K a multiple of the parts' 16-byte rows).
  expect_matches_reference(kernel("k_parts_swap"), 56, 1000, 4128, 91, ExecutionPath::fused);
  expect_matches_reference(kernel("k_parts_swap"), 8, 2056, 2080, 92, ExecutionPath::fused);
  expect_matches_reference(kernel("k_parts_swap"), 136, 776, 1056, 93, ExecutionPath::fused);
  expect_matches_reference(kernel("k_parts_gated"), 37, 2 * 500, 3096, 94, ExecutionPath::fused);
  expect_matches_reference(kernel("k_parts_gated"), 200, 2 * 1500, 1560, 95, ExecutionPath::fused);
  // A K that does not split into parts of whole 16-byte rows (4104 / 4 = 1026) runs the unfused path.
  expect_matches_reference(kernel("k_parts_swap"), 16, 1000, 4104, 96, ExecutionPath::fallback);
}

TEST(FusedConfigs, DefaultConfigurationsOfLinearLayersFromPrefillToDecode) {
  // On an H100 or H200 these come from the shipped table (exact and nearest shapes); elsewhere
  // from the rules. 80×5200×3000 and 40×8200×4000 borrow transposed entries of M = 64 and 32
  // whose tiles the H200's table lookup widens to one tile across M (64×80 and 64×48).
  // 48×9200×3000 and 56×12200×4000 borrow the M = 64 entries' 64×48 tile, which the H200's
  // lookup widens to their count of tiles (64×96); 16×2040×2056 and 8×1000×1000 pass over the
  // K-in-parts entries (16×1024×4096), whose parts would hold under 640 of K, for the transposed
  // 64×16 tile in 4×1 clusters. 40×2040×2000 narrows a borrowed transposed 64×32 tile to 16
  // columns of M (96 tiles); 44×1528×8960 and 72×760×3072 cut a borrowed 4 parts of K to the 2
  // and 3 parts that fit one wave. 48×5000×3000 and 46×4600×3600 take the transposed 64×48 tile
  // below the M = 64 entries' rows. 92×4088×10000, 108×2040×8320 and 100×3064×8192 turn the
  // entries' two 64-row tiles into the transposed tile holding M (64×96, 64×112, 64×112) with K
  // in 2, 4 and 2 parts; 116×2040×8320 keeps them (M above 112); 76×3064×18944 turns the M = 64
  // entries' 64×64 tile in 1×2 clusters into the transposed 64×80 in 2 parts; 152×3000×4000 and
  // 200×2040×8320 split M in two transposed tiles (64×80; 64×112 in 2 parts).
  const std::tuple<int, int, int> shapes[] = {
      {16, 4096, 4096}, {48, 5000, 3000},  {64, 28672, 4096}, {256, 4608, 3584}, {1000, 6000, 2000},
      {4096, 4096, 4096}, {80, 5200, 3000}, {40, 8200, 4000}, {48, 9200, 3000},  {56, 12200, 4000},
      {16, 2040, 2056}, {8, 1000, 1000},   {40, 2040, 2000},  {44, 1528, 8960},  {72, 760, 3072},
      {46, 4600, 3600}, {92, 4088, 10000}, {116, 2040, 8320}, {100, 3064, 8192},
      {108, 2040, 8320}, {76, 3064, 18944}, {152, 3000, 4000}, {200, 2040, 8320}};
  {
    std::vector<std::jthread> compiles;  // each shape's configuration, all at once
    for (const auto& [m, n, k] : shapes) compiles.emplace_back([&, m, n, k] { kernel("w1_linear").compile(m, n, k); });
  }
  for (const auto& [m, n, k] : shapes)
    expect_matches_reference(kernel("w1_linear"), m, n, k, 69 + m % 7, ExecutionPath::fused);
}

TEST(FusedConfigs, ShapesBetweenTheTablesMValuesInTransposedCooperativeTiles) {
  // On an H100 or H200 the table lookup splits these M into transposed cooperative 128-row
  // tiles (docs/backend.md, "Shapes outside the table", rule 6): one of 96 columns at 88 rows,
  // two of 112 at 200 (M, N and K no tile multiples). Elsewhere the rules' picks run.
  const std::tuple<int, int, int> shapes[] = {{88, 11000, 4000}, {200, 7200, 5000}};
  {
    std::vector<std::jthread> compiles;
    for (const auto& [m, n, k] : shapes) compiles.emplace_back([&, m, n, k] { kernel("w1_linear").compile(m, n, k); });
  }
  for (const auto& [m, n, k] : shapes)
    expect_matches_reference(kernel("w1_linear"), m, n, k, 71 + m % 5, ExecutionPath::fused);
}

TEST(FusedReductions, EveryAxisAndOpWithMainOutput) {
  expect_matches_reference(kernel("reductions"), 1000, 1016, 4096, 21, ExecutionPath::fused);
  // M=332: a non-tile multiple that keeps the f32 column vector 16-byte aligned.
  expect_matches_reference(kernel("reductions"), 332, 136, 72, 22, ExecutionPath::fused);
  // Several waves of a short main loop: the ping-pong 64×256 default of column and whole-matrix
  // reductions (docs/backend.md, "Default configurations").
  expect_matches_reference(kernel("reductions"), 2000, 4104, 1024, 24, ExecutionPath::fused);
}

// m, n and integer [m]/[n] operands: fused where the backend reads them (sm_90a), unfused under
// EVTC_ARCH=sm80.
namespace {
ExecutionPath indices_path() {
  return evtc::backend_features(evtc::target_arch(), evtc::DType::bf16).indices ? ExecutionPath::fused
                                                                                 : ExecutionPath::fallback;
}
}  // namespace

// Sizes that are no tile multiples; M a multiple of 4 (the i32 [m] vector's 16-byte accesses).
TEST(FusedIndices, LmHeadLossTermsAndMasks) {
  const ExecutionPath path = indices_path();
  expect_matches_reference(kernel("lm_head_loss"), 1000, 1016, 4096, 91, path);
  expect_matches_reference(kernel("lm_head_loss"), 332, 32000, 520, 92, path);
  expect_matches_reference(kernel("lm_head_loss"), 4100, 136, 72, 93, path);
}

TEST(FusedIndices, TransposedKernelsExchangeMAndN) {
  const ExecutionPath path = indices_path();
  expect_matches_reference(kernel("swap_indices"), 56, 1000, 1000, 94, path);
  expect_matches_reference(kernel("swap_indices"), 8, 4104, 4104, 95, path);
  expect_matches_reference(kernel("swap_indices"), 136, 776, 520, 96, path);
}

TEST(FusedReductions, BceLossWithoutMainOutput) {
  expect_matches_reference(kernel("bce_loss"), 1000, 1016, 1024, 23, ExecutionPath::fused);
  expect_matches_reference(kernel("bce_loss"), 4000, 4104, 1000, 25, ExecutionPath::fused);  // ping-pong 64×256
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

// --- fp8 A/B ---------------------------------------------------------------------------
// M and N are not tile multiples; N stays a multiple of 16 for the fp8 outputs' 16-byte rows.

TEST(FusedFp8, RowwiseColwiseScalesBiasGeluFp8OutputAndAmax) {
  expect_matches_reference(kernel("fp8_rowwise"), 1000, 1008, 2048, 41, ExecutionPath::fused);
  expect_matches_reference(kernel("fp8_rowwise"), 264, 4096, 4096, 42, ExecutionPath::fused);
}

TEST(FusedFp8, E4m3TimesE5m2Fp8MainOutputWithTensorScaleFromDevice) {
  expect_matches_reference(kernel("fp8_out_e5m2"), 1000, 1008, 2048, 43, ExecutionPath::fused);
}

TEST(FusedFp8, FastAccumulationPingPong) {
  expect_matches_reference(kernel("fp8_fastacc"), 1000, 1008, 2048, 44, ExecutionPath::fused);
}

// Block-scaled fp8: K not a multiple of 128 (the last K block is partial), M and N no tile
// multiples, N not a multiple of 128 (the last B block is partial); against the fp64
// reference of the scaled product.
TEST(FusedFp8, BlockwiseScalesBiasGeluF32CopyAndRowMax) {
  expect_matches_reference(kernel("fp8_blockwise"), 1000, 1008, 2000, 46, ExecutionPath::fused);
  expect_matches_reference(kernel("fp8_blockwise"), 264, 4096, 4096, 47, ExecutionPath::fused);
}

TEST(FusedFp8, BlockwisePingPong) {
  expect_matches_reference(kernel("fp8_blockwise_pingpong"), 776, 1040, 1168, 48, ExecutionPath::fused);
}

// The unfused path of a block-scaled GEMM (its operands scaled into fp32, an fp32 GEMM, the
// plain epilogue) gives the same results: forced with disable_fusion, and taken by a call
// whose scale_a rows are not 16-byte aligned (M = 1001 with ld = M).
TEST(FusedFp8, BlockwiseUnfusedPath) {
  evtc::CompileOptions o = kernel("fp8_blockwise").options();
  o.disable_fusion = true;
  const evtc::Kernel unfused(kernel("fp8_blockwise").graph(), o);
  expect_matches_reference(unfused, 1000, 1008, 2000, 49, ExecutionPath::fallback);
  expect_matches_reference(kernel("fp8_blockwise"), 1001, 1008, 2000, 50, ExecutionPath::fallback);
}

// The fp8 output is scaled past e4m3's range: it must saturate to ±448 (never inf or NaN),
// and amax(y) must equal the largest |y| among the kernel's own f32 copy of y, exactly.
TEST(FusedFp8, SaturatesAndAmaxIsExactOverTheKernelsOwnValues) {
  const evtc::Kernel& k = kernel("fp8_rowwise");
  const auto inputs = evtc::random_reference_inputs(k.graph(), 1000, 1008, 2048,
                                                    evtc::DType::f8e4m3, evtc::DType::f8e4m3, 45);
  evtc::runtime::DeviceProblem problem(k, inputs);
  problem.poison_outputs(nullptr);
  ASSERT_EQ(k.run(problem.arguments(), nullptr), ExecutionPath::fused);
  const auto got = problem.read_outputs(nullptr);
  double largest_q = 0, largest_y = 0;
  size_t saturated = 0;
  for (double q : got.at("q")) {
    ASSERT_TRUE(std::isfinite(q)) << "an fp8 output is " << q;
    largest_q = std::max(largest_q, std::abs(q));
    saturated += std::abs(q) == 448.0;
  }
  for (double y : got.at("y32")) largest_y = std::max(largest_y, std::abs(y));
  EXPECT_EQ(largest_q, 448.0);
  EXPECT_GT(saturated, 100u) << "the test should drive many values past the e4m3 range";
  ASSERT_EQ(got.at("ay").size(), 1u);
  EXPECT_EQ(got.at("ay")[0], largest_y);
}

TEST(FusedFp8, RefusalsNameTheReason) {
  // K must hold whole 16-byte rows of fp8 A and B.
  EXPECT_NE(kernel("fp8_fastacc").fallback_reason(1000, 1008, 1000).find(
                "K=1000 is not a multiple of 16 (f8e4m3 A needs 16-byte rows)"),
            std::string::npos);
  // fp8 A and B must both be K-major.
  evtc::CompileOptions o = kernel("fp8_fastacc").options();
  o.gemm.b_layout = evtc::Layout::row_major;
  try {
    evtc::Kernel bad(kernel("fp8_fastacc").graph(), o);
    FAIL() << "a row-major fp8 B was accepted";
  } catch (const evtc::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("fp8 A and B must both be K-major"), std::string::npos)
        << e.what();
  }
}

// --- gated activations (N -> N/2) -------------------------------------------------------
// N even but no tile multiple (and a multiple of 8 for the bf16 main output D); the
// reference takes gate = even columns, up = odd ones.

TEST(FusedOutputs, F32MainOutputOfABf16RoundedValue) {
  expect_matches_reference(kernel("rounded_f32_main"), 1000, 1032, 520, 56, ExecutionPath::fused);
}

TEST(FusedGated, EveryGatedFormBiasPreActivationAndFp8Output) {
  expect_matches_reference(kernel("gated"), 1000, 1016, 264, 51, ExecutionPath::fused);
  // N/2 = 172: no tile multiple; M = 132 (not 129): the f32 column vector s needs 16-byte rows.
  expect_matches_reference(kernel("gated"), 132, 344, 64, 52, ExecutionPath::fused);
}

TEST(FusedGated, Swiglu7AloneAtOddTileCounts) {
  expect_matches_reference(kernel("w4_swiglu7"), 777, 2 * 1000, 512, 53, ExecutionPath::fused);
  expect_matches_reference(kernel("w4_swiglu7"), 256, 512, 128, 54, ExecutionPath::fused);
}

TEST(FusedGated, UnfusedPathMatchesToo) {
  evtc::CompileOptions o = kernel("gated").options();
  o.disable_fusion = true;
  evtc::Kernel unfused(kernel("gated").graph(), o);
  expect_matches_reference(unfused, 1000, 1016, 264, 55, ExecutionPath::fallback);
}

TEST(FusedGated, OddNIsRefusedNamingTheOutput) {
  const std::string why = kernel("w4_swiglu7").fallback_reason(256, 511, 128);
  EXPECT_NE(why.find("N=511 is odd, but the gated output 'y' needs whole (gate, up) column pairs"),
            std::string::npos)
      << why;
}

TEST(FusedGated, DeviceWeightInterleavingMatchesTheHostOne) {
  const int64_t inter = 300, k = 72;
  std::vector<uint16_t> stacked(size_t(2 * inter * k));
  for (size_t i = 0; i < stacked.size(); ++i) stacked[i] = uint16_t(i * 7919u);
  for (evtc::Layout layout : {evtc::Layout::col_major, evtc::Layout::row_major}) {
    std::vector<uint16_t> want(stacked.size()), got(stacked.size());
    evtc::interleave_gate_up_host(stacked.data(), want.data(), inter, k, evtc::DType::bf16, layout);
    void *d_in = nullptr, *d_out = nullptr;
    ASSERT_EQ(cudaMalloc(&d_in, stacked.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d_out, stacked.size() * 2), cudaSuccess);
    cudaMemcpy(d_in, stacked.data(), stacked.size() * 2, cudaMemcpyHostToDevice);
    cudaMemset(d_out, 0xff, stacked.size() * 2);
    evtc::interleave_gate_up(d_in, d_out, inter, k, evtc::DType::bf16, layout, nullptr);
    cudaMemcpy(got.data(), d_out, got.size() * 2, cudaMemcpyDeviceToHost);
    cudaFree(d_in);
    cudaFree(d_out);
    EXPECT_EQ(got, want) << (layout == evtc::Layout::col_major ? "col_major" : "row_major");
  }
}
