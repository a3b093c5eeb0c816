// K in parts (KernelConfig::k_parts): the configuration's name and checks, its candidates and
// price, and the kernel it emits — a batched GEMM of the parts' fp32 products and the plain
// epilogue that adds them, in the caller's M×N whether the GEMM is transposed or not.
#include <gtest/gtest.h>

#include <string>

#include "backends/emit.hpp"
#include "evtc/expression.hpp"
#include "evtc/kernel_config.hpp"
#include "evtc/passes.hpp"
#include "runtime/selection/candidates.hpp"

using namespace evtc;

namespace {

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }
Graph lowered(const std::string& expr) { return run_pipeline(parse_expression(expr)); }

TEST(KParts, NamesParseAndRoundTrip) {
  KernelConfig c = KernelConfig::of(MainloopSchedule::pingpong, 64, 16);
  c.tile_k = 128;
  c.swap_ab = true;
  c.k_parts = 4;
  EXPECT_EQ(c.name(), "pingpong_64x16x128_c1x1_persistent_kparts4_swap");
  EXPECT_EQ(KernelConfig::parse(c.name()), c);
  auto coop = KernelConfig::parse("coop_128x128x64_c2x1_persistent_kparts16_precise");
  ASSERT_TRUE(coop);
  EXPECT_EQ(coop->k_parts, 16);
  EXPECT_TRUE(coop->precise_math);
  for (const char* bad : {"pingpong_64x16x128_c1x1_persistent_kparts1_swap", "pingpong_64x16x128_c1x1_persistent_kparts17",
                          "pingpong_64x16x128_c1x1_persistent_kparts04", "coop_128x128x64_c1x1_splitk2_kparts2",
                          "coop_128x128x64_c1x1_streamk_kparts2", "pingpong_64x16x128_c1x1_persistent_swap_kparts2"})
    EXPECT_FALSE(KernelConfig::parse(bad)) << bad;
}

TEST(KParts, RefusalsNameTheReason) {
  const KernelConfig c = *KernelConfig::parse("pingpong_64x16x128_c1x1_persistent_kparts4_swap");
  EXPECT_EQ(config_refusal(c, GemmDesc{.m = 16, .n = 1024, .k = 4096}), "");
  // K must split into parts of whole 16-byte rows: 8 bf16 elements, 16 fp8 ones.
  const std::string uneven = config_refusal(c, GemmDesc{.m = 16, .n = 1024, .k = 4100});
  EXPECT_TRUE(contains(uneven, "K = 4100 into 4 parts")) << uneven;
  EXPECT_TRUE(contains(uneven, "multiple of 8 elements")) << uneven;
  GemmDesc fp8{.m = 16, .n = 1024, .k = 4 * 24, .a_dtype = DType::f8e4m3, .b_dtype = DType::f8e4m3};
  EXPECT_TRUE(contains(config_refusal(c, fp8), "multiple of 16 elements")) << config_refusal(c, fp8);
  // Unknown K (0) is checked at run time, by the kernel's can_implement.
  EXPECT_EQ(config_refusal(c, GemmDesc{}), "");
  EXPECT_TRUE(contains(config_refusal(c, GemmDesc{.sm = 100}), "_kparts")) << config_refusal(c, GemmDesc{.sm = 100});
  GemmDesc blockwise{.a_dtype = DType::f8e4m3, .b_dtype = DType::f8e4m3};
  blockwise.fp8_blockwise = true;
  EXPECT_TRUE(contains(config_refusal(c, blockwise), "block-scaled")) << config_refusal(c, blockwise);
  // Reductions would combine with atomics in the second kernel.
  const std::string reduces = epilogue_config_refusal(lowered("out D: bf16 = acc; out r = row_sum(acc)"), c);
  EXPECT_TRUE(contains(reduces, "no fixed order")) << reduces;
  EXPECT_TRUE(contains(reduces, "'r'")) << reduces;
  EXPECT_EQ(epilogue_config_refusal(lowered("out D: bf16 = silu(acc + bias[n]) * g[m,n]"), c), "");
}

TEST(KParts, DecodeCandidatesSplitKWhereTheTilesLeaveMultiprocessorsIdle) {
  const Graph g = lowered("out D: bf16 = acc");
  GemmDesc small{.m = 16, .n = 1024, .k = 4096};
  bool parts = false;
  for (const KernelConfig& c : tuning::candidate_configs(g, small)) {
    if (c.k_parts == 1) continue;
    parts = true;
    EXPECT_EQ(tuning::prune_reason(c, g, small), "") << c.name();
    EXPECT_LE(tuning::tile_count(c, small) * c.k_parts, 2 * 132) << c.name();
  }
  EXPECT_TRUE(parts) << "16x1024x4096: 16 transposed tiles for 132 multiprocessors";
  // Where the tiles alone fill the GPU, none.
  GemmDesc wide{.m = 64, .n = 28672, .k = 4096};
  for (const KernelConfig& c : tuning::candidate_configs(g, wide)) EXPECT_EQ(c.k_parts, 1) << c.name();
  const KernelConfig four = *KernelConfig::parse("pingpong_64x16x128_c1x1_persistent_kparts4_swap");
  EXPECT_EQ(tuning::tile_count(four, small), 16);
  EXPECT_GT(tuning::grid_efficiency(four, small), 3.5 * tuning::grid_efficiency(
                                                           *KernelConfig::parse("pingpong_64x16x128_c1x1_persistent_swap"), small));
  EXPECT_TRUE(contains(tuning::prune_reason(four, lowered("out D: bf16 = acc; out r = row_sum(acc)"), small),
                       "no fixed order"));
  EXPECT_TRUE(contains(tuning::prune_reason(*KernelConfig::parse("pingpong_64x16x128_c1x1_persistent_kparts16_swap"), g,
                                            small),
                       "K is too short"));
}

TEST(KParts, EmitsABatchedProductAndThePlainEpilogueOfTheCallersGraph) {
  const Graph g = lowered("input q[n]: i64; h = acc * s[m] + bias[n]; out D: bf16 = silu(h) + C * (m != q[n]); "
                          "out P: f32 = h + r[m,n]");
  const GemmDesc gemm{.m = 16, .n = 1024, .k = 4096, .b_layout = Layout::col_major};
  KernelConfig c = *KernelConfig::parse("pingpong_64x16x128_c1x1_persistent_kparts4_swap");
  const backend::EmittedKernel swapped = backend::emit_dense_kernel(g, gemm, c);
  const std::string& s = swapped.source;
  // The caller's signature (not the product's): the runtime binds the caller's operands.
  EXPECT_EQ(swapped.signature.to_json(), make_signature(g).to_json());
  // The GEMM: a batch of 4 parts, each K/4 of A and B, into f32 partial products in the
  // workspace, column-major in the transposed kernel (row-major in the caller's M×N).
  EXPECT_TRUE(contains(s, "GemmUniversalMode::kBatched")) << s;
  EXPECT_TRUE(contains(s, "{int(a.m), int(a.n), int(part_k), 4}"));
  EXPECT_TRUE(contains(s, "const int64_t part_k = a.k / 4;"));
  EXPECT_TRUE(contains(s, "cute::get<2>(stride_a) = part_k;"));
  EXPECT_TRUE(contains(s, "cute::get<2>(stride_b) = part_k;"));
  EXPECT_TRUE(contains(s, "cute::get<1>(stride_d) = a.m;"));
  EXPECT_TRUE(contains(s, "cute::get<2>(stride_d) = a.m * a.n;"));
  EXPECT_TRUE(contains(s, "using ElementD = float;"));
  EXPECT_TRUE(contains(s, "reinterpret_cast<typename GemmKernel::ElementD*>(scratch)"));
  EXPECT_FALSE(contains(s, "Sm90ColBroadcast")) << "the GEMM's own epilogue writes the product alone";
  // The second kernel: the caller's graph, in the caller's M×N (M and N exchanged back).
  EXPECT_TRUE(contains(s, "acc_sum(acc, i * n + j, part_stride)"));
  EXPECT_TRUE(contains(s, "constexpr int kAccParts = 4;"));
  // The plain epilogue starts as a programmatic dependent of the GEMM, which lets it launch early.
  EXPECT_TRUE(contains(s, "#define CUTLASS_ENABLE_GDC_FOR_SM90 1"));
  EXPECT_TRUE(contains(s, "cudaLaunchAttributeProgrammaticStreamSerialization"));
  EXPECT_TRUE(contains(s, "griddepcontrol.wait;"));
  EXPECT_TRUE(contains(s, "const int64_t m = a.n, n = a.m;"));
  EXPECT_TRUE(contains(s, "kernel_from_image<1>(evtc_kernel_image, \"evtc_plain_epilogue\""));
  EXPECT_TRUE(contains(s, "+ partials_bytes(*a)"));
  EXPECT_TRUE(contains(s, "does not split into 4 parts"));
  // Untransposed: row-major partials, the kernel's own M and N.
  c.swap_ab = false;
  const std::string plain = backend::emit_dense_kernel(g, gemm, c).source;
  EXPECT_TRUE(contains(plain, "cute::get<0>(stride_d) = a.n;")) << plain;
  EXPECT_TRUE(contains(plain, "const int64_t m = a.m, n = a.n;"));
  // A gated epilogue runs untransposed, its pairs in the plain kernel.
  const Graph gated = lowered("out y: bf16 = swiglu(acc + bias[n])");
  const std::string gs = backend::emit_dense_kernel(gated, gemm, c).source;
  EXPECT_TRUE(contains(gs, "acc_sum(acc, i * n + j1, part_stride)")) << gs;
}

}  // namespace
