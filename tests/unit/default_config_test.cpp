// The configuration a problem runs with when nothing is tuned (default_config), at shapes of
// the table measured on the H200 (bench/results/20261124-0334-h200-default-configs.json: these
// picks were 1.00-1.02x the best of every candidate there), and the fusion cost model's verdicts.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include "evtc/expression.hpp"
#include "evtc/grouped.hpp"
#include "evtc/passes.hpp"
#include "evtc/runtime.hpp"
#include "runtime/selection/cost_model.hpp"
#include "runtime/selection/default_config.hpp"
#include "runtime/shared_memory_model.hpp"

using namespace evtc;

namespace {

Graph lowered(const std::string& expr) { return run_pipeline(parse_expression(expr)); }

std::string default_for(const std::string& expr, int64_t m, int64_t n, int64_t k) {
  GemmDesc g;
  g.m = m;
  g.n = n;
  g.k = k;
  return default_config(lowered(expr), g).name();
}

const char* kBiasSilu = "out D: bf16 = silu(acc + bias[n])";
const char* kSwiglu = "out D: bf16 = swiglu(acc)";

TEST(DefaultConfig, OneWaveProblemsTakeTheFinestTileThatFitsOneWave) {
  EXPECT_EQ(default_for(kBiasSilu, 128, 2048, 2048), "pingpong_64x128x64_c1x1_persistent");
  EXPECT_EQ(default_for(kBiasSilu, 128, 4096, 11008), "pingpong_64x128x64_c1x1_persistent");
  EXPECT_EQ(default_for(kBiasSilu, 128, 11008, 4096), "coop_128x128x64_c1x1_persistent");
  EXPECT_EQ(default_for(kBiasSilu, 128, 32000, 4096), "coop_128x256x64_c1x1_persistent");
  EXPECT_EQ(default_for(kBiasSilu, 1024, 2048, 2048), "coop_128x128x64_c1x1_persistent");
  EXPECT_EQ(default_for(kBiasSilu, 1024, 4096, 4096), "coop_128x256x64_c2x1_persistent");
  EXPECT_EQ(default_for(kSwiglu, 128, 22016, 4096), "coop_128x256x64_c1x1_persistent");
}

TEST(DefaultConfig, SeveralWavesByMainLoopLengthAndLastWave) {
  // Epilogues that read an [m,n] operand or write two outputs: cooperative 128×256, or ping-pong
  // 128×128 for a short main loop or a better-filled last wave.
  const char* residual = "out D: bf16 = silu(acc + bias[n]) + r[m,n]";
  EXPECT_EQ(default_for(residual, 8192, 4096, 4096), "coop_128x256x64_c2x1_persistent");
  EXPECT_EQ(default_for(residual, 8192, 5632, 2048), "pingpong_128x128x64_c2x1_persistent");  // K <= 2048
  EXPECT_EQ(default_for(residual, 1024, 14336, 4096), "pingpong_128x128x64_c2x1_persistent");  // last wave
  EXPECT_EQ(default_for("out D: bf16 = acc; out E: bf16 = relu(acc)", 8192, 22016, 4096),
            "coop_128x256x64_c2x1_persistent");
  EXPECT_EQ(default_for("out D: f32 = silu(acc + bias[n])", 8192, 8192, 8192), "coop_128x256x64_c2x1_persistent");
}

TEST(DefaultConfig, EpiloguesMovingSeveralMatricesTakePingpongAtAnyK) {
  // autograd's SwiGLU derivative after the down projection's data gradient: two [m,n] operands
  // read, two outputs written (bench/results/20261130-0925-h200-training-epilogue-configs.json).
  const char* dswiglu =
      "input g[m,n]: bf16; input u[m,n]: bf16; dh = bf16(acc); s = sigmoid(g)\n"
      "out du: bf16 = dh * (g * s)\nout D: bf16 = dh * u * s * (1.0 + g * (1.0 - s))";
  // Two operands and two outputs leave a 128×160 tile three main-loop stages: 128×128.
  EXPECT_EQ(default_for(dswiglu, 4096, 11008, 4096), "pingpong_128x128x64_c2x1_persistent");
  EXPECT_EQ(default_for(dswiglu, 8192, 4096, 11008), "pingpong_128x128x64_c2x1_persistent");
  // SwiGLU's forward half in training (u read; g and silu(g)·u written): 128×160 keeps four
  // (bench/results/20261130-1414-h200-epilogue-sizes-training-epilogues.json).
  const char* forward_half = "input u[m,n]: bf16; g = bf16(acc); out y0: bf16 = g; out D: bf16 = bf16(bf16(silu(g)) * u)";
  EXPECT_EQ(default_for(forward_half, 4096, 11008, 4096), "pingpong_128x160x64_c2x1_persistent");
  EXPECT_EQ(default_for(forward_half, 8192, 14336, 4096), "pingpong_128x160x64_c2x1_persistent");
  EXPECT_EQ(default_for(forward_half, 8192, 5632, 2048), "pingpong_128x160x64_c2x1_persistent");
  EXPECT_EQ(mainloop_stages(KernelConfig::of(MainloopSchedule::pingpong, 128, 160, 2), GemmDesc{},
                            epilogue_smem_bytes(lowered(forward_half), KernelConfig::of(MainloopSchedule::pingpong, 128, 160, 2))),
            selection::kHeavyEpilogueStages);
  // One matrix besides D keeps the cooperative tile (the residual above); f32 ones and
  // reductions keep their rules (128×256, narrowed to 128×128 for its stages).
  EXPECT_EQ(default_for("input r[m,n]: bf16; input s[m,n]: f32; out D: bf16 = acc * r + s", 8192, 4096, 4096),
            "coop_128x128x64_c2x1_persistent");
  EXPECT_EQ(default_for("input r[m,n]: bf16; input s[m,n]: bf16; out D: bf16 = acc * r + s; out db = col_sum(acc)",
                        8192, 4096, 4096),
            "coop_128x128x64_c2x1_persistent");
}

TEST(DefaultConfig, LightEpiloguesTakePingpong128x192WhereItsGridFillsItsWaves) {
  // bench/results/20261124-2334 and -2336-h200-visit-order.json.
  EXPECT_EQ(default_for(kSwiglu, 8192, 11264, 2048), "pingpong_128x192x64_c2x1_persistent");
  EXPECT_EQ(default_for(kBiasSilu, 8192, 8192, 8192), "pingpong_128x192x64_c2x1_persistent");
  EXPECT_EQ(default_for(kBiasSilu, 8192, 5632, 2048), "pingpong_128x192x64_c2x1_persistent");
  EXPECT_EQ(default_for("out D: bf16 = swiglu7(acc)", 7697, 27304, 5120), "pingpong_128x192x64_c2x1_persistent");
  // A long main loop on a grid the 256-row tiles fill as well: cooperative 256×192.
  EXPECT_EQ(default_for(kSwiglu, 8192, 22016, 4096), "coop_256x192x64_c2x1_persistent");
  EXPECT_EQ(default_for(kSwiglu, 8192, 28672, 4096), "coop_256x192x64_c2x1_persistent");
  EXPECT_EQ(default_for("out D: bf16 = acc", 8192, 22016, 4096), "coop_256x192x64_c2x1_persistent");
  // The accumulator read at several places keeps more values live: the pick above stays.
  EXPECT_EQ(default_for("out D: bf16 = tanh(acc) * sigmoid(acc) + gelu(acc)", 8192, 8192, 8192),
            "coop_128x256x64_c2x1_persistent");
  // Where 192-column tiles fill the waves clearly worse, the pick above stays.
  EXPECT_EQ(default_for(kBiasSilu, 8192, 11008, 4096), "coop_128x256x64_c2x1_persistent");  // 0.959 vs 0.993
  EXPECT_EQ(default_for(kBiasSilu, 8192, 4096, 4096), "coop_128x256x64_c2x1_persistent");
  EXPECT_EQ(default_for(kBiasSilu, 1024, 14336, 4096), "pingpong_128x128x64_c2x1_persistent");
  EXPECT_EQ(default_for(kBiasSilu, 4096, 4096, 4096), "coop_128x256x64_c2x1_persistent");
}

TEST(DefaultConfig, ReductionsKeepTheirMeasuredTiles) {
  EXPECT_EQ(default_for("f = acc + bias[n]; out loss = sum(f * f)", 128, 2048, 2048),
            "coop_128x256x64_c2x1_persistent");
  // Several waves of a short main loop: ping-pong overlaps the reduction's epilogue (W7, bias-grad).
  const char* w7 = "f = acc + bias[n]; out loss = sum((C - 1) * f + log(clamp(sigmoid(f), 1e-3, 0.999)))";
  EXPECT_EQ(default_for(w7, 8192, 8192, 1024), "pingpong_64x256x64_c2x1_persistent");
  EXPECT_EQ(default_for("out D: bf16 = acc; out db = col_sum(acc)", 8192, 8192, 1024),
            "pingpong_64x256x64_c2x1_persistent");
  EXPECT_EQ(default_for(w7, 8192, 8192, 4096), "coop_128x256x64_c2x1_persistent");  // a long main loop
  EXPECT_EQ(default_for("out D: bf16 = acc; out rmax = row_amax(acc)", 8192, 8192, 1024),
            "pingpong_128x128x64_c2x1_persistent");  // row reductions: as elementwise epilogues
}

UnfusedWork round_trip(int64_t m, int64_t n) {
  UnfusedWork w;
  w.saved_bytes = 2.0 * double(m) * double(n) * 2;  // bf16 written by cuBLAS and read back
  w.kernels = 1;
  return w;
}

TEST(CostModel, LargeEpiloguesPayAndNothingToSaveDoesNot) {
  const Kernel kernel(parse_expression(kBiasSilu));
  const FusionEstimate big = kernel.estimate(8192, 4096, 4096, round_trip(8192, 4096));
  EXPECT_TRUE(big.profitable()) << big.describe();
  EXPECT_GT(big.epilogue_us, 20.0);
  // A GEMM whose chain only reshapes its result saves no traffic: cuBLAS keeps it.
  const FusionEstimate views = kernel.estimate(8192, 4096, 4096, UnfusedWork{});
  EXPECT_FALSE(views.profitable()) << views.describe();
  EXPECT_EQ(views.epilogue_us, 0.0);
  EXPECT_NE(views.describe().find("unfused (model"), std::string::npos);
}

TEST(CostModel, EpiloguesMovingSeveralMatricesPayTheirTrafficOnLargeProblems) {
  // SwiGLU's derivative after the down projection's data gradient: unfused, cuBLAS writes dh,
  // and Inductor's kernel reads it back with g and u and writes the two gradients. Timed in the
  // llama_mlp training row against torch.mm (bench/results/20261130-1443-h200-models-llama_mlp-
  // train-default-2.json, -1441-...-batch8-every-fusion-debug.log): 0.996-1.008x at 4096x11008
  // and 1.119x at 8192x11008, where Inductor's kernel takes
  // about a tenth and a sixth of the GEMM. At 8192x14336 `evtc run --bench` had it 1.39x cuBLAS
  // (bench/results/20261130-1158-h200-dswiglu-by-size.json), and no model row measured it.
  const char* dswiglu =
      "input g[m,n]: bf16; input u[m,n]: bf16; dh = bf16(acc); s = sigmoid(g)\n"
      "out du: bf16 = dh * (g * s)\nout D: bf16 = dh * u * s * (1.0 + g * (1.0 - s))";
  CompileOptions rr;
  rr.gemm.b_layout = Layout::row_major;
  const Kernel kernel(parse_expression(dswiglu), rr);
  const auto unfused = [](int64_t m, int64_t n, double tensors) {
    UnfusedWork w;
    w.saved_bytes = tensors * double(m) * double(n) * 2;
    w.kernels = 1;
    return w;
  };
  for (auto [m, n] : {std::pair<int64_t, int64_t>{4096, 11008}, {8192, 11008}}) {
    const FusionEstimate e = kernel.estimate(m, n, 4096, unfused(m, n, 5));  // dh read back, g, u, 2 gradients
    EXPECT_TRUE(e.profitable()) << m << "x" << n << ": " << e.describe();
  }
  const FusionEstimate large = kernel.estimate(8192, 14336, 4096, unfused(8192, 14336, 5));
  EXPECT_FALSE(large.profitable()) << large.describe();
  // SwiGLU's forward half (u read; g and silu(g)·u written) on ping-pong 128×160: 0.948x
  // torch.mm at 4096x11008x4096 in the training row, where Inductor's kernel reads g and u and
  // writes silu(g)·u (-1424-...-every-fusion-pingpong-128x160.json: every fusion made, 1.044x
  // plain compile, against 1.026x for the default then, which fused only the derivative).
  const Kernel forward(parse_expression(
      "input u[m,n]: bf16; g = bf16(acc); out y0: bf16 = g; out D: bf16 = bf16(bf16(silu(g)) * u)"));
  const FusionEstimate half = forward.estimate(4096, 11008, 4096, unfused(4096, 11008, 3));
  EXPECT_TRUE(half.profitable()) << half.describe();
  EXPECT_EQ(half.config, "pingpong_128x160x64_c2x1_persistent");
  // The whole of the epilogue's traffic, against half of it for one matrix besides D.
  GemmDesc big;
  big.m = 8192;
  big.n = 14336;
  big.k = 4096;
  EXPECT_EQ(epilogue_exposed_share(lowered(dswiglu), big), 1.0);
  EXPECT_EQ(epilogue_exposed_share(lowered("input r[m,n]: bf16; out D: bf16 = acc + r"), big), kEpilogueExposed);
  big.m = 4096;
  EXPECT_EQ(epilogue_exposed_share(lowered(dswiglu), big), kEpilogueExposed);
}

TEST(CostModel, AFusionThatWritesMoreThanItSavesSaysSo) {
  // Training's dSwiGLU: the fused kernel writes both halves' gradients, which Inductor computes
  // inside the kernel that reads them, so fusion adds traffic: the description subtracts it.
  const Kernel kernel(parse_expression(kBiasSilu));
  UnfusedWork more;
  more.saved_bytes = -2.0 * 8192 * 4096 * 2;
  const FusionEstimate e = kernel.estimate(8192, 4096, 4096, more);
  EXPECT_LT(e.epilogue_us, 0.0);
  EXPECT_FALSE(e.profitable()) << e.describe();
  const std::string text = e.describe();
  EXPECT_NE(text.find(fmt::format("{:.1f} - {:.1f} us unfused", e.cublas_us, -e.epilogue_us)), std::string::npos) << text;
  EXPECT_NE(text.find("the fused kernel writes values the unfused path computes inside another kernel"),
            std::string::npos) << text;
  EXPECT_EQ(text.find("+ -"), std::string::npos) << text;
}

TEST(CostModel, SmallTilesAndWideEpiloguesCostTheirTime) {
  // A gradient-style epilogue (an f32 [m,n] operand read, an f32 output) at 64-row tiles:
  // measured 2.0x cuBLAS at 8192x6400x1600 on the H200; the model must not call it cheap.
  const char* wide = "input g[m,n]: f32\nout D: f32 = acc + g";
  CompileOptions small, large;
  small.config = KernelConfig::parse("pingpong_64x128x64_c1x1_persistent");
  large.config = KernelConfig::parse("pingpong_128x128x64_c2x1_persistent");
  const FusionEstimate s = Kernel(parse_expression(wide), small).estimate(8192, 6400, 1600, round_trip(8192, 6400));
  const FusionEstimate l = Kernel(parse_expression(wide), large).estimate(8192, 6400, 1600, round_trip(8192, 6400));
  EXPECT_GT(s.fused_us, 1.4 * s.cublas_us) << s.describe();
  EXPECT_FALSE(s.profitable()) << s.describe();
  EXPECT_LT(l.fused_us, s.fused_us);
  // The epilogue's own traffic counts: 420 MB of f32 read and written is not free beside the
  // main loop.
  const FusionEstimate plain = Kernel(parse_expression("out D: f32 = acc"), large).estimate(8192, 6400, 1600, round_trip(8192, 6400));
  EXPECT_GT(l.fused_us, plain.fused_us + 20.0);
}

TEST(CostModel, ReductionsPayForTheirPartialsTheirFoldAndTheirTileEnds) {
  // A bias gradient beside the data gradient (GPT-2's c_fc at 4096 rows): the column sum's
  // partials (32 tile rows x 6400 f32, written and read back), its fold kernel's launch, and on
  // cooperative 128x256 tiles CUTLASS's fold across the tile's warps, 3 us per wave of tiles
  // (800 tiles: 7 waves); measured 25 us more than without the sum there.
  const auto fused_us = [&](const char* config, const char* expr) {
    CompileOptions o;
    o.config = KernelConfig::parse(config);
    return Kernel(parse_expression(expr), o).estimate(4096, 6400, 1600, round_trip(4096, 6400)).fused_us;
  };
  const char* plain = "d = bf16(acc)\nout D: bf16 = d";
  const char* summed = "d = bf16(acc)\nout D: bf16 = d\nout db: bf16 = col_sum(d)";
  const double partials_us = 2.0 * 32 * 6400 * 4 / 4.3e6;  // at the H200's bandwidth, the model's default GPU
  const char* coop = "coop_128x256x64_c2x1_persistent";
  EXPECT_NEAR(fused_us(coop, summed) - fused_us(coop, plain), 3.0 + partials_us + 7 * 3.0, 0.2);
  // Ping-pong 128x128 keeps the column buffer in local memory: 7 us per wave (1600 tiles, 13 waves).
  const char* pingpong = "pingpong_128x128x64_c2x1_persistent";
  EXPECT_NEAR(fused_us(pingpong, summed) - fused_us(pingpong, plain), 3.0 + partials_us + 13 * 7.0, 0.2);
  // Ping-pong 64x256: the fold kernel and the partials only (64 tile rows).
  const char* narrow = "pingpong_64x256x64_c2x1_persistent";
  EXPECT_NEAR(fused_us(narrow, summed) - fused_us(narrow, plain), 3.0 + 2 * partials_us, 0.2);
  // A row reduction (over N) adds its own fold kernel, and no fold across warps.
  const double two = fused_us(coop, "d = bf16(acc)\nout D: bf16 = d\nout db: bf16 = col_sum(d)\nout peak = row_max(d)");
  EXPECT_NEAR(two - fused_us(coop, summed), 3.0 + 2.0 * 25 * 4096 * 4 / 4.3e6, 0.2);
}

TEST(CostModel, GroupedChainsCompareWithTheGroupedGemm) {
  // The moe layer of bench/models.py (top-2 of 8 experts over 8192 tokens, hidden 2048, FFN
  // 1408): its merged gate/up grouped GEMM with SwiGLU measured faster fused (the layer 1.09x
  // plain compile, bench/results/20261125-0125-h200-models.json). The unfused GEMM is
  // torch._grouped_mm, a ptr-array kernel of the same family as evtc's, not cuBLAS.
  const GroupedKernel merged(parse_expression("out y: bf16 = swiglu(acc)"));
  UnfusedWork swiglu_kernel;
  swiglu_kernel.saved_bytes = 16384.0 * 2816 * 2 + 16384.0 * 1408 * 2;  // the result read back, y written
  swiglu_kernel.kernels = 1;
  swiglu_kernel.gemms = 2;  // unfused: the gate and the up projection, 1408 columns each
  const FusionEstimate up = merged.estimate(16384, 2816, 2048, 8, swiglu_kernel);
  EXPECT_TRUE(up.profitable()) << up.describe();
  // Measured: 0.30 ms fused against 0.32 ms for the two torch._grouped_mm and 0.045 ms for the
  // SwiGLU kernel (bench/results/20261125-0118-h200-models.json, torch.profiler).
  EXPECT_NEAR(up.fused_us / up.cublas_us, 1.0, 0.1) << up.describe();
  EXPECT_NE(up.describe().find("model (grouped)"), std::string::npos);
  // The down projection's chain leaves nothing for an epilogue kernel to do: no fusion.
  const GroupedKernel down(parse_expression("out D: bf16 = acc"));
  const FusionEstimate plain = down.estimate(16384, 2048, 1408, 8, UnfusedWork{});
  EXPECT_FALSE(plain.profitable()) << plain.describe();
}

TEST(CostModel, ADecodeGridIsBoundByWhatEachMultiprocessorStreams) {
  // 48x2048x8192 in transposed 64x16 tiles: 96 tiles, each streaming 64 rows of B and 16 of A
  // over K (1.31 MB) at 80 GB/s, 16.4 us, longer than the 34.5 MB of the whole problem at the
  // device's 4.3 TB/s (8.0 us); plus 3 us for the kernel (the epilogue's 0.2 MB half exposed).
  auto priced = [](const char* config, int64_t m, int64_t n, int64_t k) {
    CompileOptions o;
    o.config = KernelConfig::parse(config);
    return Kernel(parse_expression("out D: bf16 = acc"), o).estimate(m, n, k, UnfusedWork{}).fused_us;
  };
  const char* sixteen = "pingpong_64x16x128_c1x1_persistent_swap";
  EXPECT_NEAR(priced(sixteen, 48, 2048, 8192), 3.0 + 16.384, 0.1);
  // Beyond one wave the grid's efficiencies price the streaming: 128x128 tiles at 4096x11008x4096
  // (2,752 tiles in 21 waves, 2.1 MB each) would take 550 us at 80 GB/s a multiprocessor; the
  // tensor cores' rate at the tile's efficiency prices it at about 505.
  EXPECT_LT(priced("pingpong_128x128x64_c2x1_persistent", 4096, 11008, 4096), 530.0);
  // A wider tile holding M streams more of A per tile but runs fewer of them, all in one wave.
  EXPECT_NEAR(priced("pingpong_64x48x128_c1x1_persistent_swap", 48, 2048, 8192), 3.0 + (64 + 48) * 2 * 8192 / 80e3,
              0.1);
  // K in 4 parts: a quarter of K per tile (32 x 4 = 128 units, one wave), then the parts' sum.
  const double parts = priced("pingpong_64x16x128_c1x1_persistent_kparts4_swap", 16, 2048, 8192);
  EXPECT_GT(parts, 3.0 + 16.384 / 4);
  EXPECT_LT(parts, priced(sixteen, 16, 2048, 8192));
  // Stream-K spreads K over the multiprocessors: the device's bandwidth bounds it.
  EXPECT_LT(priced("coop_128x16x64_c1x1_streamk_swap", 16, 2048, 8192), 3.0 + 16.384);
}

TEST(CostModel, DecodeSizedProblemsStayWithCuBLAS) {
  const Kernel kernel(parse_expression(kBiasSilu));
  const FusionEstimate decode = kernel.estimate(64, 11008, 4096, round_trip(64, 11008));
  EXPECT_FALSE(decode.profitable()) << decode.describe();
}

}  // namespace

TEST(CostModel, APreciseMathKernelIsPricedByTheTableEntryWhoseMainLoopItRuns) {
  // precise_math changes the epilogue's arithmetic only: the table's time of its configuration
  // still prices the kernel; any other difference (tile, cluster, schedule) does not.
  const KernelConfig entry = KernelConfig::of(MainloopSchedule::pingpong, 128, 160, 2);
  KernelConfig precise = entry;
  precise.precise_math = true;
  EXPECT_TRUE(selection::runs_table_entry(entry, entry));
  EXPECT_TRUE(selection::runs_table_entry(precise, entry));
  KernelConfig other = precise;
  other.tile_n = 128;
  EXPECT_FALSE(selection::runs_table_entry(other, entry));
  other = precise;
  other.cluster_m = 1;
  EXPECT_FALSE(selection::runs_table_entry(other, entry));
}
