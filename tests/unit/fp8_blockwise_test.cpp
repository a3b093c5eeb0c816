// Block-scaled fp8 GEMMs (GemmDesc::fp8_blockwise) on the CPU: the rule that decides which
// GEMMs and configurations can be block-scaled, the option spellings, the code the emitters
// write for them, and the fp64 reference of the scaled product.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "backends/cuda/fallback_emitter.hpp"
#include "backends/cutlass3/emitter.hpp"
#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/options.hpp"
#include "evtc/passes.hpp"
#include "evtc/reference.hpp"
#include "evtc/runtime.hpp"
#include "runtime/selection/candidates.hpp"
#include "runtime/selection/tuning_store.hpp"

using namespace evtc;

namespace {

GemmDesc blockwise_gemm() {
  GemmDesc g;
  g.a_dtype = g.b_dtype = DType::f8e4m3;
  g.a_layout = Layout::row_major;
  g.b_layout = Layout::col_major;
  g.fp8_blockwise = true;
  return g;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST(Fp8Blockwise, OnlyFp8OperandsWithoutFastAccumulation) {
  GemmDesc g = blockwise_gemm();
  EXPECT_EQ(fp8_blockwise_refusal(g), "");
  g.a_dtype = g.b_dtype = DType::bf16;
  EXPECT_EQ(fp8_blockwise_refusal(g),
            "fp8 block scales (fp8_blockwise): A is bf16 and B is bf16: block scales apply to fp8 operands "
            "(f8e4m3, f8e5m2) only");
  g = blockwise_gemm();
  g.fp8_fast_accum = true;
  EXPECT_TRUE(contains(fp8_blockwise_refusal(g), "fast accumulation cannot be combined with them"));
  g.fp8_blockwise = false;
  EXPECT_EQ(fp8_blockwise_refusal(g), "") << "not block-scaled: nothing to refuse";

  CompileOptions o;
  o.gemm = blockwise_gemm();
  o.gemm.b_dtype = DType::bf16;
  EXPECT_THROW(Kernel(parse_expression("out D: bf16 = acc"), o), UserError);
}

TEST(Fp8Blockwise, ConfigurationsNeedTilesOfWholeScaleBlocks) {
  const GemmDesc g = blockwise_gemm();
  EXPECT_EQ(config_refusal(*KernelConfig::parse("coop_128x128x128_c1x1_persistent"), g), "");
  EXPECT_EQ(config_refusal(*KernelConfig::parse("pingpong_64x256x128_c2x1_persistent"), g), "");
  EXPECT_EQ(config_refusal(*KernelConfig::parse("pingpong_128x192x128_c2x1_persistent"), g),
            "configuration pingpong_128x192x128_c2x1_persistent has 192×128 (N×K) tiles, but a block-scaled "
            "fp8 GEMM needs tiles whose N and K are multiples of its 128-wide scale blocks (e.g. "
            "coop_128x128x128_c1x1_persistent)");
  EXPECT_NE(config_refusal(*KernelConfig::parse("coop_128x128x64_c1x1_persistent"), g), "");
  EXPECT_EQ(config_refusal(*KernelConfig::parse("coop_128x128x128_c1x1_persistent_fastacc"), g),
            "configuration coop_128x128x128_c1x1_persistent_fastacc asks for fast accumulation, which a "
            "block-scaled fp8 GEMM does not have");
  GemmDesc plain = g;
  plain.fp8_blockwise = false;
  EXPECT_EQ(config_refusal(*KernelConfig::parse("pingpong_128x192x128_c2x1_persistent"), plain), "");

  // A fixed configuration that cannot be block-scaled is refused when the Kernel is built.
  CompileOptions o;
  o.gemm = g;
  o.config = KernelConfig::parse("pingpong_128x192x128_c2x1_persistent");
  try {
    Kernel k(parse_expression("out D: bf16 = acc"), o);
    FAIL() << "a 192-wide tile was accepted for a block-scaled GEMM";
  } catch (const UserError& e) {
    EXPECT_TRUE(contains(e.what(), "multiples of its 128-wide scale blocks")) << e.what();
  }

  // The default and every tuning candidate can be block-scaled.
  GemmDesc sized = g;
  sized.m = 4096;
  sized.n = 7168;
  sized.k = 2048;
  const Graph graph = run_pipeline(parse_expression("out D: bf16 = acc"));
  const KernelConfig def = default_config(graph, sized);
  EXPECT_EQ(def.name(), "coop_128x128x128_c1x1_persistent");
  tuning::DeviceLimits limits;
  const auto candidates = tuning::candidate_configs(graph, sized, limits, 0);
  ASSERT_FALSE(candidates.empty());
  for (const KernelConfig& c : candidates) EXPECT_EQ(config_refusal(c, sized), "") << c.name();
}

TEST(Fp8Blockwise, OptionTextSpellsIt) {
  OptionText t;
  t.a_dtype = t.b_dtype = "f8e4m3";
  t.fp8_blockwise = true;
  EXPECT_TRUE(compile_options(t).gemm.fp8_blockwise);
  const OptionText back = option_text_from_json(option_text_json(t));
  EXPECT_TRUE(back.fp8_blockwise);
  EXPECT_TRUE(option_text(compile_options(t).gemm, CastMode::eager, false).fp8_blockwise);
  t.a_dtype = t.b_dtype = "bf16";
  try {
    compile_options(t);
    FAIL() << "bf16 operands were accepted with fp8 block scales";
  } catch (const UserError& e) {
    EXPECT_TRUE(contains(e.what(), "block scales apply to fp8 operands")) << e.what();
  }
  EXPECT_THROW(option_text_from_json(R"({"fp8_blockwise": "yes"})"), UserError);
}

TEST(Fp8Blockwise, TunedChoicesOfPlainAndBlockScaledGemmsAreKeptApart) {
  tuning::ProblemIdentity a;
  a.graph_hash = "0123";
  a.gemm = blockwise_gemm();
  a.arch = 90;
  a.device_name = "NVIDIA H200";
  tuning::ProblemIdentity b = a;
  b.gemm.fp8_blockwise = false;
  EXPECT_NE(tuning::problem_key(a), tuning::problem_key(b));
}

TEST(Fp8Blockwise, FusedKernelUsesTheBlockScaledMainLoop) {
  const Graph g = run_pipeline(parse_expression("input bias[n]: bf16\nout D: bf16 = gelu(acc + bias[n])"));
  KernelConfig coop = *KernelConfig::parse("coop_128x128x128_c1x1_persistent");
  const std::string s = cutlass3::emit_kernel(g, blockwise_gemm(), coop).source;
  EXPECT_TRUE(contains(s, "sm90_mma_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp"));
  EXPECT_TRUE(contains(s, "using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise;"));
  EXPECT_TRUE(contains(s, "using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128>;"));
  EXPECT_TRUE(contains(s, "ElementA, cute::tuple<LayoutA, LayoutSFA>,"));
  EXPECT_TRUE(contains(s, "ElementB, cute::tuple<LayoutB, LayoutSFB>,"));
  // The scales come from the ABI's fields, A's with its own leading dimension.
  EXPECT_TRUE(contains(s, "static_cast<const float*>(a.scale_a), layout_sfa, static_cast<const float*>(a.scale_b), layout_sfb}"));
  EXPECT_TRUE(contains(s, "cute::make_stride(cute::_0{}, int(a.ld_scale_a))"));
  EXPECT_FALSE(contains(s, "sm90_mma_tma_gmma_ss_warpspecialized_fp8.hpp"));

  KernelConfig pingpong = *KernelConfig::parse("pingpong_64x128x128_c1x1_persistent");
  EXPECT_TRUE(contains(cutlass3::emit_kernel(g, blockwise_gemm(), pingpong).source,
                       "cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise;"));

  // Without block scales: the two-level main loop, no scale layouts.
  GemmDesc plain = blockwise_gemm();
  plain.fp8_blockwise = false;
  const std::string p = cutlass3::emit_kernel(g, plain, coop).source;
  EXPECT_FALSE(contains(p, "Blockwise"));
  EXPECT_FALSE(contains(p, "LayoutSFA"));
  EXPECT_TRUE(contains(p, "ElementA, LayoutA, 128"));
}

TEST(Fp8Blockwise, UnfusedPathScalesTheOperandsIntoFp32) {
  const Graph g = run_pipeline(parse_expression("out D: bf16 = acc"));
  const KernelSignature sig = make_signature(g);
  const GemmDesc gemm = blockwise_gemm();
  const std::string s = cuda::emit_fallback_kernel(g, sig, &gemm);
  EXPECT_TRUE(contains(s, "extern \"C\" int evtc_fallback_scale_operands(const evtc_gemm_args* a, float* a32, float* b32, void* stream)"));
  // A: one scale per row (rows_per_block 1), any strides; B: per 128 rows of its N×K
  // storage, any strides.
  EXPECT_TRUE(contains(s, "static_cast<const float*>(a->scale_a), 1, a->scale_a_m_stride, a->ld_scale_a, a32)"));
  EXPECT_TRUE(contains(s, "static_cast<const float*>(a->scale_b), 128, a->scale_b_n_stride, a->scale_b_k_stride, b32)"));
  EXPECT_TRUE(contains(s, "static_cast<const __nv_fp8_e4m3*>(a->a)"));
  EXPECT_FALSE(contains(cuda::emit_fallback_kernel(g, sig), "evtc_fallback_scale_operands"));
}

// The reference multiplies every element by its block's scales: checked against the sum
// written out, with K and N not multiples of 128 (partial last blocks).
TEST(Fp8Blockwise, ReferenceScalesEachBlock) {
  const Graph g = run_pipeline(parse_expression("out D: f32 = acc"));
  const int64_t m = 3, n = 130, k = 200;
  ReferenceInputs in = random_reference_inputs(g, m, n, k, DType::f8e4m3, DType::f8e4m3, 11);
  add_random_block_scales(in, 11);
  ASSERT_EQ(in.scale_a.size(), size_t(m * 2));
  ASSERT_EQ(in.scale_b.size(), size_t(2 * 2));
  bool varied = false;
  for (double s : in.scale_b) {
    EXPECT_GT(s, 0);
    varied |= s != in.scale_b[0];
  }
  EXPECT_TRUE(varied) << "the blocks should have different scales";
  const std::vector<double> got = evaluate_reference(g, in).at("D");
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (int64_t l = 0; l < k; ++l)
        want += in.a[i * k + l] * in.scale_a[i * 2 + l / 128] * in.b[l * n + j] * in.scale_b[(l / 128) * 2 + j / 128];
      EXPECT_NEAR(got[i * n + j], float(want), std::abs(want) * 1e-6 + 1e-12) << i << "," << j;
    }
  in.scale_b.pop_back();
  EXPECT_THROW(evaluate_reference(g, in), UserError);
}

// fp8's two-level promotion interval (KernelConfig::fp8_promotion_k): named "_pk<K>", whole K
// tiles, set on the main loop's arguments, and refused where there is no two-level accumulation.
TEST(Fp8PromotionInterval, NamedSetAndRefusedElsewhere) {
  const auto c = KernelConfig::parse("coop_128x128x128_c1x1_persistent_pk256");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->fp8_promotion_k, 256);
  EXPECT_EQ(c->name(), "coop_128x128x128_c1x1_persistent_pk256");
  EXPECT_EQ(KernelConfig::parse("coop_128x128x128_c1x1_persistent_pk256_precise")->name(),
            "coop_128x128x128_c1x1_persistent_pk256_precise");
  EXPECT_FALSE(KernelConfig::parse("coop_128x128x128_c1x1_persistent_pk200").has_value()) << "not whole K tiles";
  EXPECT_FALSE(KernelConfig::parse("coop_128x128x128_c1x1_persistent_fastacc_pk256").has_value());

  GemmDesc fp8 = blockwise_gemm();
  fp8.fp8_blockwise = false;
  EXPECT_EQ(config_refusal(*c, fp8), "");
  EXPECT_TRUE(contains(config_refusal(*c, blockwise_gemm()), "only the two-level accumulation"));
  EXPECT_TRUE(contains(config_refusal(*c, GemmDesc{}), "only the two-level accumulation"));

  const Graph g = run_pipeline(parse_expression("input sa[m]: f32\ninput sb[n]: f32\nout D: bf16 = acc * sa[m] * sb[n]"));
  const std::string s = cutlass3::emit_kernel(g, fp8, *c).source;
  EXPECT_TRUE(contains(s, "args.mainloop.mma_promotion_interval =\n      256 / cute::size<2>")) << s.substr(0, 0);
  EXPECT_FALSE(contains(cutlass3::emit_kernel(g, fp8, *KernelConfig::parse("coop_128x128x128_c1x1_persistent")).source,
                        "mma_promotion_interval"));
}
