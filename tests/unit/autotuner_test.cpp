// The autotuner's CPU side (src/runtime/selection/candidates.hpp, tuning_store.hpp): candidate generation and pruning,
// the persisted record format, the store, nearest-shape lookup, and Kernel's choice of
// configuration without a GPU.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <set>
#include <tuple>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/passes.hpp"
#include "evtc/runtime.hpp"
#include "runtime/selection/candidates.hpp"
#include "runtime/selection/tuning_store.hpp"

using namespace evtc;
using namespace evtc::tuning;

namespace {

Graph lowered(const std::string& expr) { return run_pipeline(parse_expression(expr)); }

GemmDesc problem(int64_t m, int64_t n, int64_t k, DType ab = DType::bf16) {
  GemmDesc g;
  g.a_dtype = g.b_dtype = ab;
  g.m = m;
  g.n = n;
  g.k = k;
  return g;
}

KernelConfig config(const std::string& name) {
  auto c = KernelConfig::parse(name);
  EXPECT_TRUE(c) << name;
  return c.value_or(KernelConfig{});
}

const char* kBiasSilu = "out D: bf16 = silu(acc + bias[n])";
const char* kLoss = "f = acc + bias[n]; out loss = sum(f * f)";

TEST(TuningCandidates, StartWithTheDefaultAndAreAllBuildableAndUnpruned) {
  const Graph g = lowered(kBiasSilu);
  for (auto p : {problem(4096, 4096, 4096), problem(8192, 8192, 1024), problem(1000, 3000, 520)}) {
    const auto cands = candidate_configs(g, p);
    ASSERT_FALSE(cands.empty());
    EXPECT_EQ(cands[0], default_config(g, p));
    for (const auto& c : cands) {
      EXPECT_TRUE(KernelConfig::parse(c.name())) << c.name();
      EXPECT_EQ(prune_reason(c, g, p), "") << c.name();
      EXPECT_EQ(std::count(cands.begin(), cands.end(), c), 1) << c.name() << " twice";
    }
  }
}

TEST(TuningCandidates, BudgetSpansScheduleAndTileFamilies) {
  const Graph g = lowered(kBiasSilu);
  const auto cands = candidate_configs(g, problem(4096, 4096, 4096), {}, 4);
  ASSERT_EQ(cands.size(), 4u);
  bool pingpong = false;
  for (const auto& c : cands) pingpong |= c.schedule == MainloopSchedule::pingpong;
  EXPECT_TRUE(pingpong) << "a budget of 4 should include a ping-pong kernel";
  EXPECT_GT(candidate_configs(g, problem(4096, 4096, 4096)).size(), 4u);
  EXPECT_LT(candidate_configs(g, problem(4096, 4096, 4096), {}, 4).size(),
            candidate_configs(g, problem(4096, 4096, 4096), {}, 0).size());
}

TEST(TuningCandidates, ReductionsGetPersistentKernelsOfBothSchedules) {
  const Graph g = lowered(kLoss);
  const auto cands = candidate_configs(g, problem(8192, 8192, 1024), {}, 0);
  ASSERT_GE(cands.size(), 2u);
  bool pingpong = false;
  for (const auto& c : cands) {
    EXPECT_EQ(c.scheduler, TileSchedulerKind::persistent) << c.name();
    pingpong |= c.schedule == MainloopSchedule::pingpong;
  }
  EXPECT_TRUE(pingpong) << "per-warp partials work with ping-pong's one warp group per tile";
}

TEST(TuningCandidates, Fp8TwoLevelAccumulationKeepsBothAccumulatorsInRegisters) {
  const Graph g = lowered(kBiasSilu);
  GemmDesc p = problem(4096, 4096, 4096);
  p.a_dtype = p.b_dtype = DType::f8e4m3;
  for (const auto& c : candidate_configs(g, p, {}, 0)) {
    EXPECT_FALSE(c.fp8_fast_accum) << c.name();
    EXPECT_EQ(c.tile_k, 128) << c.name();
    const int threads = c.schedule == MainloopSchedule::pingpong ? 128 : 256;
    EXPECT_LE(2 * c.tile_m * c.tile_n / threads, 192) << c.name();  // 232 registers a thread
  }
  p.fp8_fast_accum = true;
  bool wide = false;
  for (const auto& c : candidate_configs(g, p, {}, 0)) {
    EXPECT_TRUE(c.fp8_fast_accum) << c.name();
    wide |= c.tile_m * c.tile_n == 128 * 256;
  }
  EXPECT_TRUE(wide) << "fast accumulation keeps one accumulator: 128x256 tiles fit";
}

// CUTLASS's two-level fp8 loop promotes every 128 of K (or every _pk<K>) counted in whole K tiles:
// a K tile of 256 never meets the interval and CUTLASS refuses the problem at run time. The
// decode-sized candidates keep K tiles of 128 for it (256 with fast accumulation).
TEST(TuningCandidates, Fp8TwoLevelAccumulationTakesKTilesThatDivideThePromotionInterval) {
  GemmDesc p = problem(16, 6144, 4096);
  p.a_dtype = p.b_dtype = DType::f8e4m3;
  const std::string why = config_refusal(*KernelConfig::parse("pingpong_64x64x256_c1x1_persistent"), p);
  EXPECT_NE(why.find("promotes every 128 of K"), std::string::npos) << why;
  EXPECT_EQ(config_refusal(*KernelConfig::parse("pingpong_64x64x256_c1x1_persistent_pk256"), p), "");
  EXPECT_EQ(config_refusal(*KernelConfig::parse("pingpong_64x64x128_c1x1_persistent"), p), "");
  EXPECT_EQ(config_refusal(*KernelConfig::parse("coop_128x128x64_c1x1_persistent"), p), "");  // two K tiles
  const Graph g = lowered(kBiasSilu);
  bool pingpong64 = false;
  for (const auto& c : candidate_configs(g, p, {}, 0)) {
    EXPECT_EQ(c.tile_k, 128) << c.name();
    pingpong64 |= c.schedule == MainloopSchedule::pingpong && c.tile_m == 64 && !c.swap_ab;
  }
  EXPECT_TRUE(pingpong64) << "the decode-sized 64-row tiles stay, with K tiles of 128";
  // At large M the widest two-level tile that holds both accumulator sets is cooperative
  // 128x192 (ping-pong 128x192 would need 384 a thread); 16-bit problems take ping-pong's.
  GemmDesc large = problem(8192, 28672, 4096);
  large.a_dtype = large.b_dtype = DType::f8e4m3;
  auto has = [&](const GemmDesc& gd, const std::string& name) {
    for (const auto& c : candidate_configs(g, gd, {}, 0))
      if (c.name() == name) return true;
    return false;
  };
  EXPECT_TRUE(has(large, "coop_128x192x128_c1x1_persistent"));
  EXPECT_FALSE(has(large, "pingpong_128x192x128_c1x1_persistent"));
  EXPECT_FALSE(has(problem(8192, 28672, 4096), "coop_128x192x64_c1x1_persistent"));
  EXPECT_TRUE(has(problem(8192, 28672, 4096), "pingpong_128x192x64_c1x1_persistent"));
  p.fp8_fast_accum = true;
  EXPECT_EQ(config_refusal(*KernelConfig::parse("pingpong_64x64x256_c1x1_persistent_fastacc"), p), "");
}

TEST(TuningCandidates, SkinnyProblemsGetSmallMTiles) {
  const Graph g = lowered(kBiasSilu);
  const auto cands = candidate_configs(g, problem(64, 8192, 4096), {}, 0);
  bool small_m = false;
  for (const auto& c : cands) {
    small_m |= c.tile_m == 64;
    EXPECT_NE(c.tile_m, 256) << c.name() << ": three quarters of a 256-row tile would be padding";
  }
  EXPECT_TRUE(small_m);
}

TEST(TuningCandidates, DecodeProblemsGetNarrowTilesAndSplitK) {
  const Graph g = lowered("out D: bf16 = acc");
  // 16 rows: no tile is that short, so 64-row tiles are not "mostly padding".
  for (const int64_t m : {16, 64}) {
    const auto cands = candidate_configs(g, problem(m, 4096, 4096), {}, 0);
    bool narrow = false, split = false;
    for (const auto& c : cands) {
      narrow |= c.tile_m == 64 && c.tile_n == 32;  // 128 tiles for 132 multiprocessors
      split |= c.splits > 1;
      EXPECT_LE(tile_count(c, problem(m, 4096, 4096)) * c.splits, 2 * 132) << c.name();
    }
    EXPECT_TRUE(narrow) << m;
    EXPECT_TRUE(split) << m;
  }
  // Large problems keep the usual space.
  for (const auto& c : candidate_configs(g, problem(8192, 8192, 4096), {}, 0)) {
    EXPECT_EQ(c.splits, 1) << c.name();
    EXPECT_GE(c.tile_n, 128) << c.name();
  }
}

TEST(TuningCandidates, UpTo384RowsTransposedTilesHoldOrSplitM) {
  const Graph plain = lowered("out D: bf16 = acc");
  auto transposed = [](const std::vector<KernelConfig>& cands) {
    std::vector<std::string> out;
    for (const auto& c : cands)
      if (c.swap_ab) out.push_back(c.name());
    return out;
  };
  auto has = [](const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  // 80 rows: one 64x80 transposed tile streams the weights once (two 64-row tiles would twice);
  // cooperative 128-row transposed tiles hold M in one tile or split it into two to four.
  const auto at80 = transposed(candidate_configs(plain, problem(80, 5120, 3072), {}, 0));
  for (const char* name : {"pingpong_64x80x128_c1x1_persistent_swap", "pingpong_64x80x128_c4x1_persistent_swap",
                           "coop_128x80x64_c1x1_persistent_swap", "coop_128x80x64_c4x1_persistent_swap",
                           "coop_128x48x64_c1x1_persistent_swap", "coop_128x32x64_c1x1_persistent_swap"})
    EXPECT_TRUE(has(at80, name)) << name;
  const auto at100 = transposed(candidate_configs(plain, problem(100, 3072, 8192), {}, 0));
  EXPECT_TRUE(has(at100, "pingpong_64x112x128_c1x1_persistent_swap"));
  EXPECT_TRUE(has(at100, "coop_128x112x64_c1x1_persistent_swap"));
  // 200 rows: two tiles of 112 (cuBLAS's own kernel there takes two of 104), and 300: two of 160.
  EXPECT_TRUE(has(transposed(candidate_configs(plain, problem(200, 7168, 5120), {}, 0)),
                  "coop_128x112x64_c1x1_persistent_swap"));
  EXPECT_TRUE(has(transposed(candidate_configs(plain, problem(300, 35840, 5120), {}, 0)),
                  "coop_128x160x64_c4x1_persistent_swap"));
  // Decode sizes get the same tiles in 4x1 clusters (cuBLAS's 64x64 and 112x64 there), the
  // ping-pong ones also with K tiles of 64; at 16 rows one tile of 16 columns. 385 rows and
  // more get no transposed tile.
  const auto at64 = transposed(candidate_configs(plain, problem(64, 5120, 3072), {}, 0));
  for (const char* name : {"coop_128x64x64_c4x1_persistent_swap", "coop_128x32x64_c1x1_persistent_swap",
                           "pingpong_64x64x128_c4x1_persistent_swap", "pingpong_64x64x64_c4x1_persistent_swap",
                           "pingpong_64x32x64_c4x1_persistent_swap"})
    EXPECT_TRUE(has(at64, name)) << name;
  const auto at16 = transposed(candidate_configs(plain, problem(16, 37888, 3584), {}, 0));
  EXPECT_TRUE(has(at16, "pingpong_64x16x64_c4x1_persistent_swap"));
  EXPECT_FALSE(has(at16, "pingpong_64x32x64_c4x1_persistent_swap"));
  EXPECT_FALSE(has(at80, "pingpong_64x80x64_c4x1_persistent_swap"));
  EXPECT_TRUE(transposed(candidate_configs(plain, problem(400, 16384, 4096), {}, 0)).empty());
  // A row sum (over the transposed kernel's M) compiles at 80 columns, not at 112: wider
  // transposed tiles are pruned.
  const Graph row = lowered("out D: bf16 = acc; out rs = row_sum(acc)");
  for (int64_t m : {80, 100, 200}) {
    const auto cands = candidate_configs(row, problem(m, 5120, 3072), {}, 0);
    for (const auto& c : cands)
      if (c.swap_ab) EXPECT_LE(c.tile_n, 80) << c.name() << " at M = " << m;
  }
}

TEST(TuningCandidates, TransposedGridsCountTheirOwnTiles) {
  // A transposed tile runs N in its rows: 300x35840 in 128x112 transposed tiles is 280 x 3 =
  // 840 tiles, seven waves of 132 holding 924 (not 3 x 320 = 960, M and N exchanged twice).
  KernelConfig c = KernelConfig::of(MainloopSchedule::cooperative, 128, 112, 1);
  c.swap_ab = true;
  const GemmDesc g = problem(300, 35840, 5120);
  EXPECT_EQ(tile_count(c, g), 840);
  EXPECT_NEAR(grid_efficiency(c, g, {}), 840.0 / 924.0 * (300.0 / 336.0), 1e-9);
  for (int64_t m : {65, 100, 200, 300})
    for (int64_t n : {3000, 11008, 35840}) {
      const double e = grid_efficiency(c, problem(m, n, 4096), {});
      EXPECT_GT(e, 0.0);
      EXPECT_LE(e, 1.0) << m << "x" << n;
    }
}

TEST(TuningCandidates, WidthsFittedToWholeWaves) {
  const Graph g = lowered("out D: bf16 = acc");
  const DeviceLimits device{};  // 132 multiprocessors
  ASSERT_EQ(device.sm_count, 132);
  // 1024×4608: 128×256 tiles make 144 tiles (a second wave of 12); 256×144 makes 128 and
  // 128×144 makes 256 (two waves of 128).
  const GemmDesc p = problem(1024, 4608, 3584);
  const auto cands = candidate_configs(g, p, device, 0);
  auto has = [&](const std::string& name) {
    return std::find(cands.begin(), cands.end(), config(name)) != cands.end();
  };
  EXPECT_TRUE(has("coop_256x144x64_c1x1_persistent"));
  EXPECT_TRUE(has("pingpong_128x144x64_c1x1_persistent"));
  EXPECT_EQ(tile_count(config("coop_256x144x64_c1x1_persistent"), p), 128);
  // Every fitted width is a multiple of 16 whose accumulators fit (ping-pong 128×224 would
  // need 224 a thread: at 1024×3584 it is left out, its 64-row twin kept).
  const auto at_3584 = candidate_configs(g, problem(1024, 3584, 4096), device, 0);
  bool pp64_224 = false;
  for (const auto& c : at_3584) {
    EXPECT_EQ(c.tile_n % 16, 0) << c.name();
    EXPECT_FALSE(c.schedule == MainloopSchedule::pingpong && c.tile_m == 128 && c.tile_n == 224) << c.name();
    pp64_224 |= c.tile_m == 64 && c.tile_n == 224;
  }
  EXPECT_TRUE(pp64_224);
  // Problems of many waves get no fitted widths: their last wave costs little.
  for (const auto& c : candidate_configs(g, problem(16384, 10240, 8192), device, 0))
    EXPECT_EQ(c.tile_n % 32, 0) << c.name();
}
TEST(TuningPruning, SplitKOnlyWhereTheTilesLeaveMultiprocessorsIdle) {
  const Graph g = lowered("out D: bf16 = acc");
  EXPECT_EQ(prune_reason(config("coop_128x128x64_c1x1_splitk4"), g, problem(64, 4096, 4096)), "");
  EXPECT_NE(prune_reason(config("coop_128x128x64_c1x1_splitk4"), g, problem(4096, 4096, 4096)).find("waves"),
            std::string::npos);
  EXPECT_NE(prune_reason(config("coop_128x128x64_c1x1_splitk8"), g, problem(64, 4096, 1024)).find("K is too short"),
            std::string::npos);
  EXPECT_NE(prune_reason(config("coop_128x128x64_c1x1_splitk4"), lowered(kLoss), problem(64, 4096, 4096)).find("reductions"),
            std::string::npos);
}

// A reduction over M with 16-column epilogue subtiles (widths that are odd multiples of 16) in
// tiles of 128 or more rows fails CUTLASS's static assertions, and so does one in transposed
// kernels wider than 80 columns (nvcc: ping-pong 128x112 and cooperative 256x144 with a column
// sum, transposed 64x96 and 64x112 with a row sum); the rule lives in epilogue_config_refusal,
// which the pruning and an explicit configuration both ask.
TEST(TuningPruning, ColumnReductionsNeedThirtyTwoColumnEpilogueSubtilesInTallTiles) {
  const Graph col = lowered("out D: bf16 = acc; out cs = col_sum(acc)");
  const Graph row = lowered("out D: bf16 = acc; out rs = row_sum(acc)");
  const std::string why = epilogue_config_refusal(col, config("pingpong_128x112x64_c1x1_persistent"));
  EXPECT_NE(why.find("112-column tiles"), std::string::npos) << why;
  EXPECT_NE(why.find("'cs'"), std::string::npos) << why;
  EXPECT_NE(epilogue_config_refusal(col, config("coop_256x144x64_c1x1_persistent")), "");
  EXPECT_EQ(epilogue_config_refusal(row, config("coop_256x144x64_c1x1_persistent")), "");   // compiles
  EXPECT_EQ(epilogue_config_refusal(col, config("pingpong_64x48x128_c1x1_persistent")), "");  // compiles
  EXPECT_EQ(epilogue_config_refusal(col, config("pingpong_128x128x64_c1x1_persistent")), "");
  // Transposed, the row sum is the kernel's reduction over M: 16 and 80 columns compile, 96 and
  // 112 do not (nvcc).
  EXPECT_EQ(epilogue_config_refusal(row, config("pingpong_64x16x128_c1x1_persistent_swap")), "");
  EXPECT_EQ(epilogue_config_refusal(row, config("pingpong_64x80x128_c1x1_persistent_swap")), "");
  for (const char* wide : {"pingpong_64x96x128_c1x1_persistent_swap", "pingpong_64x112x128_c1x1_persistent_swap"}) {
    const std::string swapped = epilogue_config_refusal(row, config(wide));
    EXPECT_NE(swapped.find("its reduction over N ('rs', over the transposed kernel's M)"), std::string::npos)
        << swapped;
    EXPECT_EQ(epilogue_config_refusal(col, config(wide)), "");  // over the transposed kernel's N
  }
  EXPECT_EQ(epilogue_config_refusal(col, config("pingpong_64x256x64_c2x1_persistent")), "");  // W7's default
  // Untransposed 64-row tiles (nvcc): a column reduction compiles at 48, 80, 128, 192 and 256
  // columns, not at 96, 112, 144, 160 or 176 (the fuzzer's kernel 263 of seed 20261128).
  const auto pingpong_64 = [](int width) { return config(fmt::format("pingpong_64x{}x64_c1x1_persistent", width)); };
  for (int width : {48, 80, 128, 192, 256}) EXPECT_EQ(epilogue_config_refusal(col, pingpong_64(width)), "") << width;
  for (int width : {96, 112, 144, 160, 176}) {
    const std::string why64 = epilogue_config_refusal(col, pingpong_64(width));
    EXPECT_NE(why64.find(fmt::format("64-row tiles {} columns wide; its reduction over M ('cs')", width)),
              std::string::npos)
        << why64;
    EXPECT_EQ(epilogue_config_refusal(row, pingpong_64(width)), "");
  }
  EXPECT_NE(prune_reason(config("pingpong_128x112x64_c1x1_persistent"), col, problem(1024, 3584, 4096)), "");
  EXPECT_NE(epilogue_config_refusal(col, config("coop_128x128x64_c1x1_streamk")).find("stream-K"), std::string::npos);
  // No candidate of a column-reducing epilogue is one of them.
  for (const auto& c : candidate_configs(col, problem(1024, 3584, 4096)))
    EXPECT_EQ(epilogue_config_refusal(col, c), "") << c.name();
}

TEST(TuningPruning, NamesWhyAConfigurationIsDropped) {
  const Graph g = lowered(kBiasSilu);
  const GemmDesc big = problem(8192, 8192, 8192);
  EXPECT_NE(prune_reason(config("pingpong_128x256x64_c1x1_persistent"), g, big).find("registers"),
            std::string::npos);
  EXPECT_NE(prune_reason(config("coop_256x128x64_c2x1_persistent"), g, problem(200, 8192, 4096)).find("cluster"),
            std::string::npos);
  // 132 tiles of 128x256 fill the H100's 132 multiprocessors exactly: stream-K adds nothing.
  EXPECT_NE(prune_reason(config("coop_128x256x64_c1x1_streamk"), g, problem(128 * 11, 256 * 12, 8192)).find("stream-K"),
            std::string::npos);
  EXPECT_NE(prune_reason(config("coop_128x256x64_c1x1_streamk"), lowered(kLoss), big).find("reductions"),
            std::string::npos);
  EXPECT_EQ(prune_reason(config("coop_128x256x64_c2x1_persistent"), g, big), "");
  // 192 accumulators a thread fit (ptxas: no spills); 256 do not.
  EXPECT_EQ(prune_reason(config("pingpong_128x192x64_c2x1_persistent"), g, big), "");
  EXPECT_EQ(prune_reason(config("coop_256x192x64_c2x1_persistent"), g, big), "");
  EXPECT_NE(prune_reason(config("coop_256x256x64_c2x1_persistent"), g, big).find("256 accumulators"),
            std::string::npos);
  // A K tile of 128 on 16-bit operands leaves too few stages in shared memory.
  EXPECT_NE(prune_reason(config("coop_256x128x128_c1x1_persistent"), g, big).find("shared memory"),
            std::string::npos);
}

TEST(TuningPruning, StreamKIsKeptWhenTheLastWaveIsMostlyEmpty) {
  const Graph g = lowered(kBiasSilu);
  // 133 tiles: two waves, the second with one tile.
  EXPECT_EQ(prune_reason(config("coop_128x256x64_c1x1_streamk"), g, problem(128 * 7, 256 * 19, 8192)), "");
  EXPECT_LT(heuristic_score(config("coop_128x256x64_c1x1_persistent"), problem(128 * 7, 256 * 19, 8192)),
            heuristic_score(config("coop_128x256x64_c1x1_streamk"), problem(128 * 7, 256 * 19, 8192)));
}

ProblemIdentity identity(const std::string& device = "NVIDIA H100 80GB HBM3") {
  ProblemIdentity id;
  id.graph_hash = "0123456789abcdef";
  id.device_name = device;
  return id;
}

TuningRecord record(int64_t m, int64_t n, int64_t k, const std::string& best) {
  TuningRecord r;
  r.m = m;
  r.n = n;
  r.k = k;
  r.best = config(best);
  r.best_ms = 0.25;
  r.identity = identity();
  r.tuned_at = "2026-01-01T00:00:00Z";
  r.candidates = {{best, 0.25, ""}, {"coop_128x128x64_c1x1_persistent", -1, "did not compile: x"}};
  return r;
}

TEST(TuningRecord, RoundTripsThroughJson) {
  const TuningRecord r = record(4096, 2048, 1024, "pingpong_128x128x64_c2x1_persistent");
  const TuningRecord back = TuningRecord::from_json(r.to_json());
  EXPECT_EQ(back.m, 4096);
  EXPECT_EQ(back.n, 2048);
  EXPECT_EQ(back.k, 1024);
  EXPECT_EQ(back.best, r.best);
  EXPECT_DOUBLE_EQ(back.best_ms, 0.25);
  EXPECT_EQ(back.identity.device_name, r.identity.device_name);
  ASSERT_EQ(back.candidates.size(), 2u);
  EXPECT_LT(back.candidates[1].median_ms, 0);
  EXPECT_EQ(back.candidates[1].error, "did not compile: x");
}

TEST(TuningRecord, KeepsTheVisitingOrderAndReadsRecordsWithoutOne) {
  TuningRecord r = record(1024, 3584, 4096, "coop_128x256x64_c1x1_persistent");
  r.order = *VisitOrder::parse("along_n_s4");
  r.orders = {{"heuristic", 0.3}, {"along_n_s4", 0.25}};
  const TuningRecord back = TuningRecord::from_json(r.to_json());
  EXPECT_EQ(back.order.name(), "along_n_s4");
  ASSERT_EQ(back.orders.size(), 2u);
  EXPECT_DOUBLE_EQ(back.orders[1].second, 0.25);
  // A record written before orders were tuned ran with CUTLASS's order.
  std::string text = record(1, 2, 3, "coop_128x256x64_c2x1_persistent").to_json();
  const auto at = text.find("  \"order\": \"heuristic\",\n");
  ASSERT_NE(at, std::string::npos) << text;
  text.erase(at, std::string("  \"order\": \"heuristic\",\n").size());
  EXPECT_EQ(TuningRecord::from_json(text).order, VisitOrder{});
  text = r.to_json();
  text.replace(text.find("\"along_n_s4\","), 13, "\"sideways\",");
  EXPECT_THROW(TuningRecord::from_json(text), RuntimeError);
}

TEST(VisitOrder, NamesParseBackAndOthersAreRefused) {
  const std::vector<VisitOrder> all = VisitOrder::all();
  ASSERT_EQ(all.size(), 9u);
  EXPECT_EQ(all[0], VisitOrder{});  // CUTLASS's own first: the tuner's baseline
  std::set<std::string> names;
  for (const VisitOrder& o : all) {
    EXPECT_EQ(VisitOrder::parse(o.name()), o) << o.name();
    names.insert(o.name());
  }
  EXPECT_EQ(names.size(), all.size());
  EXPECT_EQ(VisitOrder{}.name(), "heuristic");
  EXPECT_EQ((VisitOrder{VisitOrder::Raster::along_n, 8}).name(), "along_n_s8");
  EXPECT_EQ(VisitOrder::parse("heuristic_s4")->swizzle, 4);
  for (const char* bad : {"", "along_n_s1", "along_n_s16", "along_k", "along_m_8", "ALONG_M"})
    EXPECT_FALSE(VisitOrder::parse(bad)) << bad;
}

TEST(KernelConfigChoice, AGivenVisitingOrderIsUsedForEveryShape) {
  CompileOptions o;
  o.visit_order = VisitOrder::parse("along_m_s2");
  Kernel k(parse_expression(kBiasSilu), o);
  EXPECT_EQ(k.config_choice(4096, 4096, 4096).order.name(), "along_m_s2");
  EXPECT_EQ(k.config_choice(16, 4096, 4096).order.name(), "along_m_s2");
  EXPECT_EQ(Kernel(parse_expression(kBiasSilu)).config_choice(4096, 4096, 4096).order, VisitOrder{});
}

TEST(TuningRecord, RejectsOtherFormatsAndUnknownConfigs) {
  EXPECT_THROW(TuningRecord::from_json("not json"), RuntimeError);
  EXPECT_THROW(TuningRecord::from_json(R"({"format": 99})"), RuntimeError);
  std::string text = record(1, 2, 3, "coop_128x256x64_c2x1_persistent").to_json();
  for (size_t at; (at = text.find("coop_128x256x64_c2x1_persistent")) != std::string::npos;)
    text.replace(at, 31, "coop_100x256x64_c2x1_persistent");
  EXPECT_THROW(TuningRecord::from_json(text), RuntimeError);
}

TEST(TuningStore, KeysSeparateDevicesLayoutsAndGraphs) {
  ProblemIdentity a = identity(), b = identity("NVIDIA H200"), c = identity(), d = identity();
  c.gemm.b_layout = c.gemm.b_layout == Layout::row_major ? Layout::col_major : Layout::row_major;
  d.graph_hash = "fedcba9876543210";
  EXPECT_NE(problem_key(a), problem_key(b));
  EXPECT_NE(problem_key(a), problem_key(c));
  EXPECT_NE(problem_key(a), problem_key(d));
  EXPECT_EQ(problem_key(a), problem_key(identity()));
}

TEST(TuningStore, SavesFindsAndListsRecords) {
  const auto dir = std::filesystem::temp_directory_path() / ("evtc-store-test-" + std::to_string(getpid()));
  const TuningStore store(dir.string(), identity());
  EXPECT_FALSE(store.find(4096, 4096, 4096));
  store.save(record(4096, 4096, 4096, "coop_128x256x64_c2x1_persistent"));
  store.save(record(8192, 8192, 1024, "pingpong_128x128x64_c2x1_persistent"));
  store.save(record(4096, 4096, 4096, "coop_256x128x64_c1x2_persistent"));  // replaces the first
  const auto found = store.find(4096, 4096, 4096);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->best.name(), "coop_256x128x64_c1x2_persistent");
  EXPECT_EQ(store.all().size(), 2u);
  // A damaged file is skipped, not fatal.
  std::ofstream(std::filesystem::path(store.folder()) / "1x1x1.json") << "{";
  EXPECT_EQ(store.all().size(), 2u);
  EXPECT_FALSE(store.find(1, 1, 1));
  // Another device's folder is empty.
  EXPECT_TRUE(TuningStore(dir.string(), identity("NVIDIA H200")).all().empty());
  std::filesystem::remove_all(dir);
}

TEST(TuningNearest, PicksTheClosestShapeInLogSpace) {
  const std::vector<TuningRecord> rs = {record(4096, 4096, 4096, "coop_128x256x64_c2x1_persistent"),
                                        record(8192, 8192, 1024, "pingpong_128x128x64_c2x1_persistent"),
                                        record(8192, 8192, 8192, "coop_256x128x64_c2x1_persistent")};
  EXPECT_FALSE(nearest({}, 1, 2, 3));
  EXPECT_EQ(nearest(rs, 8192, 8192, 1024)->k, 1024);    // exact
  EXPECT_EQ(nearest(rs, 8192, 8192, 1536)->k, 1024);    // 1.5x from 1024, 5.3x from 8192
  EXPECT_EQ(nearest(rs, 5000, 5000, 5000)->m, 4096);
  EXPECT_EQ(nearest(rs, 6000, 6000, 6000)->m, 8192);
  EXPECT_EQ(nearest(rs, 16384, 16384, 8192)->m, 8192);
  // Equal distances: the smaller shape, whatever the order.
  const std::vector<TuningRecord> tie = {record(2048, 1, 1, "coop_128x256x64_c2x1_persistent"),
                                         record(512, 1, 1, "coop_256x128x64_c2x1_persistent")};
  EXPECT_EQ(nearest(tie, 1024, 1, 1)->m, 512);
  EXPECT_EQ(nearest({tie[1], tie[0]}, 1024, 1, 1)->m, 512);
}

TEST(TuneMode, NamesParseBack) {
  for (auto m : {TuneMode::off, TuneMode::first_call, TuneMode::ahead})
    EXPECT_EQ(parse_tune_mode(tune_mode_name(m)), m);
  EXPECT_FALSE(parse_tune_mode("always"));
}

TEST(KernelConfigChoice, TheSourceIsTheChosenConfigurationsKernel) {
  Kernel k(parse_expression(kBiasSilu));
  for (auto [m, n, kk] : {std::tuple<int64_t, int64_t, int64_t>{0, 0, 0}, {8192, 8192, 1024}, {16, 4096, 4096}}) {
    const std::string source = k.source(m, n, kk);
    EXPECT_NE(source.find("; kernel config " + k.config_for(m, n, kk).name() + "."), std::string::npos)
        << m << "x" << n << "x" << kk;
    EXPECT_NE(source.find("evtc_gemm_kernel"), std::string::npos);
  }
}

TEST(KernelConfigChoice, FixedConfigsWinAndUnknownSizesTakeTheHeuristic) {
  CompileOptions o;
  o.config = config("coop_256x128x64_c1x2_persistent");
  Kernel fixed(parse_expression(kBiasSilu), o);
  EXPECT_EQ(fixed.config_choice(4096, 4096, 4096).source, ConfigChoice::Source::fixed);
  EXPECT_EQ(fixed.config_for(4096, 4096, 4096), *o.config);
  Kernel k(parse_expression(kBiasSilu));
  EXPECT_EQ(k.config_choice(0, 0, 0).source, ConfigChoice::Source::heuristic);
  EXPECT_EQ(k.config_for(8192, 8192, 1024), default_config(k.graph(), problem(8192, 8192, 1024)));
}

TEST(KernelConfigChoice, AGivenConfigurationSlowForTheOperandLayoutsRunsWithAWarning) {
  CompileOptions o;
  o.config = config("pingpong_128x144x64_c2x1_persistent");
  o.gemm.b_layout = Layout::row_major;
  testing::internal::CaptureStderr();
  Kernel slow(parse_expression(kBiasSilu), o);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(slow.config_for(4096, 1600, 6400), *o.config);  // the caller's choice stands
  EXPECT_NE(err.find("configuration pingpong_128x144x64_c2x1_persistent runs, but slowly: the kernel reads B "
                     "row-major, and 144 tile columns of bf16 make 288-byte rows"),
            std::string::npos)
      << err;
  o.gemm.b_layout = Layout::col_major;  // read along K: any width of 16 columns is fine
  testing::internal::CaptureStderr();
  Kernel fine(parse_expression(kBiasSilu), o);
  EXPECT_EQ(testing::internal::GetCapturedStderr().find("slowly"), std::string::npos);
}

TEST(KernelConfigChoice, BadTuneEnvironmentIsAUserError) {
  setenv("EVTC_TUNE", "sometimes", 1);
  EXPECT_THROW(Kernel(parse_expression(kBiasSilu)), UserError);
  unsetenv("EVTC_TUNE");
  setenv("EVTC_TUNE_MAX_CANDIDATES", "-3", 1);
  EXPECT_THROW(Kernel(parse_expression(kBiasSilu)), UserError);
  unsetenv("EVTC_TUNE_MAX_CANDIDATES");
}

}  // namespace

TEST(DefaultConfig, EpiloguesStagingManyMatricesGetNarrowerTiles) {
  // W1 takes the ping-pong 128×192 tile of light epilogues, W2 keeps the 128×256 tile (3
  // main-loop stages beside its epilogue)...
  const auto p = problem(8192, 8192, 8192);
  EXPECT_EQ(default_config(lowered(kBiasSilu), p).name(), "pingpong_128x192x64_c2x1_persistent");
  EXPECT_EQ(default_config(lowered("out D: bf16 = acc * gate[m,n]"), p).name(),
            "coop_128x256x64_c2x1_persistent");
  // ...a bf16 and an f32 aux operand would leave it two: 128×128 then...
  const Graph wide = lowered("input r[m,n]: bf16; input s[m,n]: f32; out D: bf16 = acc * r + s");
  EXPECT_EQ(default_config_for_shape(wide, p).tile_n, 256);
  EXPECT_EQ(default_config(wide, p).name(), "coop_128x128x64_c2x1_persistent");
  // ...and three aux operands and three [m,n] outputs (a backward epilogue) take ping-pong
  // 128×128, whose two tiles' stages fit beside them.
  const Graph heavy = lowered(
      "f = acc * a1[m,n] + a2[m,n] * a3[m,n]; out D: bf16 = f; out g1: bf16 = f * a1[m,n]; "
      "out g2: bf16 = silu(f)");
  EXPECT_EQ(default_config(heavy, p).name(), "pingpong_128x128x64_c2x1_persistent");
}
