// The shipped selection tables (src/runtime/selection/shipped_table.hpp): every embedded table
// parses and names configurations evtc builds; a table's errors name the file and the field;
// a shape's entry is its own, else the nearest measured M's best-fitting entry.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/passes.hpp"
#include "evtc/runtime.hpp"
#include "target/device_info.hpp"
#include "runtime/selection/candidates.hpp"
#include "runtime/selection/cost_model.hpp"
#include "runtime/selection/tuning_store.hpp"
#include "runtime/selection/default_config.hpp"
#include "runtime/selection/shipped_table.hpp"

using namespace evtc;
using namespace evtc::selection;

namespace {

std::string table_json(const std::string& entries) {
  return R"({"format": 1, "gpu": "NVIDIA H100 80GB HBM3", "gpu_class": "h100", "dtype": "bf16", "entries": [)" +
         entries + "]}";
}

std::string entry(int64_t m, int64_t n, int64_t k, const std::string& config) {
  return fmt::format(R"({{"m": {}, "n": {}, "k": {}, "config": "{}", "ms": 0.1, "cublas_ms": 0.1}})", m, n, k,
                     config);
}

TEST(SelectionTable, EveryShippedTableParsesAndItsConfigurationsAreBuildable) {
  ASSERT_EQ(shipped_tables().size(), embedded_tables().size());
  for (const SelectionTable& t : shipped_tables()) {
    EXPECT_FALSE(t.entries.empty()) << t.file;
    EXPECT_EQ(gpu_class_of(t.gpu), t.gpu_class) << t.file;
    for (const TableEntry& e : t.entries) {
      GemmDesc g;
      g.a_dtype = g.b_dtype = t.dtype;
      g.m = e.m;
      g.n = e.n;
      g.k = e.k;
      // A shipped choice is one the tuner could have made: legal, and not pruned for its shape
      // with the epilogue it was measured with.
      const char* measured = t.kind == TableKind::residual ? "out D: bf16 = acc + r[m,n]" : "out D: bf16 = acc";
      EXPECT_EQ(tuning::prune_reason(e.config, run_pipeline(parse_expression(measured)), g), "")
          << t.file << " " << e.m << "x" << e.n << "x" << e.k << " " << e.config.name();
      // A transposed winner names the untransposed configuration gated epilogues take instead.
      if (e.config.swap_ab)
        EXPECT_TRUE(e.unswapped.has_value() && e.unswapped_ms > 0)
            << t.file << " " << e.m << "x" << e.n << "x" << e.k << ": no unswapped_config";
    }
  }
}

TEST(SelectionTable, ErrorsNameTheFileAndTheField) {
  auto error_of = [](const std::string& json) {
    try {
      parse_table(json, "x.json");
    } catch (const RuntimeError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of("{").find("selection table x.json is not JSON"), std::string::npos);
  EXPECT_NE(error_of(table_json(entry(16, 4096, 4096, "coop_1x2"))).find("entry 0: 'coop_1x2' is not a kernel "
                                                                          "configuration"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"format": 1, "gpu": "g", "gpu_class": "h100", "dtype": "bf16", "entries": [{"m": "x"}]})")
                .find("entry 0: 'm' has the wrong type (string)"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"format": 2})").find("format 2, expected 1"), std::string::npos);
  EXPECT_NE(error_of(table_json(R"({"m": 16, "n": 4096, "k": 4096, "config": "coop_128x256x64_c2x1_persistent",
                                    "order": "zigzag", "ms": 0.1, "cublas_ms": 0.1})"))
                .find("entry 0: 'zigzag' is not a tile visiting order"),
            std::string::npos);
  EXPECT_NE(error_of(table_json(entry(0, 4096, 4096, "coop_128x256x64_c2x1_persistent"))).find("positive"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"format": 1, "gpu": "g", "gpu_class": "h200", "dtype": "bf16", "kind": "gelu",
                         "entries": []})")
                .find("x.json: kind 'gelu' is not one a table is measured with"),
            std::string::npos);
}

TEST(SelectionTable, AResidualTableServesEpiloguesWithOneMNOperand) {
  const SelectionTable t = parse_table(
      R"({"format": 1, "gpu": "NVIDIA H200", "gpu_class": "h200", "dtype": "bf16", "kind": "residual", "entries": [
          {"m": 1024, "n": 4096, "k": 4096, "config": "pingpong_128x128x64_c2x1_persistent", "ms": 0.05,
           "cublas_ms": 0.05}]})",
      "r.json");
  EXPECT_EQ(t.kind, TableKind::residual);
  EXPECT_EQ(t.smallest_m(), 1024);
  // Its times include reading r besides writing D.
  EXPECT_EQ(t.epilogue_bytes(1024, 4096), 4.0 * 1024 * 4096);
  EXPECT_EQ(parse_table(table_json(entry(16, 4096, 4096, "coop_128x256x64_c2x1_persistent")), "p.json")
                .epilogue_bytes(1024, 4096),
            2.0 * 1024 * 4096);
  // The H200's shipped residual table is found by its kind, and the H100 borrows it (same chip).
  const SelectionTable* residual = table_for("h200", DType::bf16, 0, TableKind::residual);
  ASSERT_NE(residual, nullptr);
  EXPECT_EQ(residual->kind, TableKind::residual);
  EXPECT_NE(residual, table_for("h200", DType::bf16));
  EXPECT_EQ(table_for("h200", DType::bf16)->kind, TableKind::plain);
  EXPECT_EQ(table_for("h200", DType::f16, 0, TableKind::residual), residual);
  EXPECT_EQ(table_for("h100", DType::bf16, residual->sm_count, TableKind::residual), residual);
  EXPECT_EQ(table_for("h200", DType::f8e4m3, 0, TableKind::residual), nullptr);
  // One 16-bit [m,n] operand (or C) and one 16-bit [m,n] output, the accumulator read once.
  for (const char* one : {"out D: bf16 = acc + r[m,n]", "out D: bf16 = acc * s[n] + r[m,n]",
                          "input r[m,n]: f16\nout D: f16 = silu(acc + b[n]) + r"})
    EXPECT_TRUE(operand_epilogue(run_pipeline(parse_expression(one)))) << one;
  for (const char* other : {"out D: bf16 = acc",                                 // light
                            "input r[m,n]: f32\nout D: bf16 = acc + r",          // a 4-byte operand
                            "out D: f32 = acc + r[m,n]",                         // a 4-byte output
                            "out D: bf16 = acc + r[m,n] + q[m,n]",               // two operands
                            "out D: bf16 = acc + r[m,n]\nout E: bf16 = acc",     // two outputs
                            "out D: bf16 = acc + r[m,n]; out s = row_sum(acc)",  // a reduction
                            "out D: bf16 = acc * s[n] + acc + r[m,n]"})          // acc read twice
    EXPECT_FALSE(operand_epilogue(run_pipeline(parse_expression(other)))) << other;
}

TEST(SelectionTable, AnEntryCarriesItsVisitingOrder) {
  const SelectionTable t = parse_table(
      table_json(entry(16, 4096, 4096, "pingpong_64x32x128_c1x1_persistent") + "," +
                 R"({"m": 8192, "n": 4096, "k": 4096, "config": "coop_128x256x64_c2x1_persistent",
                     "order": "along_n_s8", "ms": 0.2, "cublas_ms": 0.2})"),
      "t.json");
  ASSERT_EQ(t.entries.size(), 2u);
  EXPECT_EQ(t.entries[0].order, VisitOrder{});  // no "order": CUTLASS's
  EXPECT_EQ(t.entries[1].order.name(), "along_n_s8");
}

TEST(SelectionTable, MatchesTheSameShapeElseTheNearestMeasuredM) {
  const SelectionTable t = parse_table(
      table_json(entry(16, 4096, 4096, "pingpong_64x32x128_c1x1_persistent") + "," +
                 entry(64, 4096, 4096, "pingpong_64x64x128_c1x1_persistent") + "," +
                 entry(64, 28672, 4096, "pingpong_64x256x64_c1x1_persistent") + "," +
                 entry(8192, 4096, 4096, "coop_128x256x64_c2x1_persistent")),
      "t.json");
  auto config_of = [&](int64_t m, int64_t n, int64_t k) {
    const auto found = match(t, m, n, k, 132);
    return found ? found->entry->config.name() + (found->exact ? " exact" : "") : std::string("none");
  };
  EXPECT_EQ(config_of(64, 4096, 4096), "pingpong_64x64x128_c1x1_persistent exact");
  // 32 is as near to 16 as to 64 on a log scale: the larger M, whose tiles hold it.
  EXPECT_EQ(config_of(32, 4096, 4096), "pingpong_64x64x128_c1x1_persistent");
  EXPECT_EQ(config_of(20, 4096, 4096), "pingpong_64x32x128_c1x1_persistent");
  // Among M = 64's entries, the nearest in N and K whose tile grid still fills the GPU: 102
  // tiles of 64x256 at N = 26000 (112 at its own shape), but only 86 at N = 22016, where the
  // 64x64 tiles of the next nearest entry fill 2.6 waves.
  EXPECT_EQ(config_of(48, 26000, 4096), "pingpong_64x256x64_c1x1_persistent");
  EXPECT_EQ(config_of(48, 22016, 4096), "pingpong_64x64x128_c1x1_persistent");
  EXPECT_EQ(config_of(6000, 5120, 4096), "coop_128x256x64_c2x1_persistent");
  EXPECT_EQ(config_of(0, 4096, 4096), "none");
}

// The configuration `t` gives M×N×K on a 132-multiprocessor GPU (an H100 SXM or H200).
std::string matched_config(const SelectionTable& t, int64_t m, int64_t n, int64_t k) {
  return match(t, m, n, k, 132)->entry->config.name();
}

TEST(SelectionTable, NearestEntriesAreComparedAtTheProblemsRowTiles) {
  // M = 256's nearest entry runs 128-row tiles in 2x1 clusters: two row tiles there, three at
  // M = 384, which the clusters round up to four (a third more tiles, and waves to match). The
  // next nearest entry's unclustered 192-column tiles fill the GPU as well at 384 as at its own
  // shape. Measured on the H200: 1.72x cuBLAS for the first at 384x16384x3072, 0.99x for the
  // second (bench/results/20261128-1433-h200-gemm-sweep-off-grid-picks.json).
  const SelectionTable t = parse_table(
      table_json(entry(256, 16384, 3072, "pingpong_128x160x64_c2x1_persistent") + "," +
                 entry(256, 28672, 4096, "pingpong_128x192x64_c1x1_persistent")),
      "t.json");
  auto config_of = [&](int64_t m, int64_t n, int64_t k) { return matched_config(t, m, n, k); };
  EXPECT_EQ(config_of(384, 16384, 3072), "pingpong_128x192x64_c1x1_persistent");
  // At M = 200 the clusters hold both row tiles, as at 256: the nearest entry carries over.
  EXPECT_EQ(config_of(200, 16384, 3072), "pingpong_128x160x64_c2x1_persistent");
  // The last row tile's padding is the problem's, whatever the tile: M = 250 is not penalised.
  EXPECT_EQ(config_of(250, 16384, 3072), "pingpong_128x160x64_c2x1_persistent");
}

TEST(SelectionTable, ANearestEntryInClustersOfFourIsNotTakenWhereItsGridNeedsAnotherWave) {
  // A wave of 4x1 clusters holds 120 tiles on 132 multiprocessors (resident_cluster_ctas). At
  // 8x8192x8192 the entry at 16x10240x8192 (transposed 64x16 in 4x1 clusters: 160 tiles, two
  // waves) would run 128 tiles in two waves where unclustered tiles take one: the next nearest
  // entry's are taken. Measured on the H200: 1.19x cuBLAS for the first, 1.01x for the second
  // (bench/results/20261129-2127-h200-gemm-sweep-off-grid-m64-clusters.json).
  const SelectionTable t = parse_table(
      table_json(entry(16, 10240, 8192, "pingpong_64x16x128_c4x1_persistent_swap") + "," +
                 entry(16, 7168, 18432, "pingpong_64x16x128_c1x1_persistent_swap")),
      "t.json");
  auto config_of = [&](int64_t m, int64_t n, int64_t k) { return matched_config(t, m, n, k); };
  EXPECT_EQ(config_of(8, 8192, 8192), "pingpong_64x16x128_c1x1_persistent_swap");
  // 9000 columns: 141 tiles, two waves either way: the nearest entry carries over.
  EXPECT_EQ(config_of(8, 9000, 8192), "pingpong_64x16x128_c4x1_persistent_swap");
  EXPECT_EQ(resident_cluster_ctas(132, 4), 120);
  EXPECT_EQ(resident_cluster_ctas(132, 2), 132);
  EXPECT_EQ(resident_cluster_ctas(114, 4), 112);
}

// A problem of M×N×K (bf16, A row-major, B column-major: GemmDesc's defaults).
GemmDesc gemm(int64_t m, int64_t n, int64_t k) {
  GemmDesc g;
  g.m = m;
  g.n = n;
  g.k = k;
  return g;
}

// What a rule turned a borrowed configuration into, or "kept" where it stood aside.
std::string name_or_kept(const std::optional<KernelConfig>& c) { return c ? c->name() : std::string("kept"); }

// A table entry measured at M×N×K with `config`.
TableEntry table_entry(int64_t m, int64_t n, int64_t k, const char* config) {
  TableEntry e;
  e.m = m;
  e.n = n;
  e.k = k;
  e.config = *KernelConfig::parse(config);
  return e;
}

TEST(SelectionTable, ABorrowedTransposedTileWidensToOneTileAcrossM) {
  auto widened = [&](const std::string& config, int64_t m, int64_t n, int64_t k, int64_t measured_m = 64) {
    return name_or_kept(one_token_tile(*KernelConfig::parse(config), gemm(m, n, k), {132}, measured_m));
  };
  // The M = 64 entry's 64x64 transposed tile takes two tiles across 80 rows: 160 tiles, two
  // waves, B read twice. Widened to 80 columns: 80 tiles, one wave.
  EXPECT_EQ(widened("pingpong_64x64x128_c1x1_persistent_swap", 80, 5120, 3072),
            "pingpong_64x80x128_c1x1_persistent_swap");
  // Two tiles across M that fit one wave (96 tiles) run side by side: kept.
  EXPECT_EQ(widened("pingpong_64x32x128_c1x1_persistent_swap", 40, 3072, 3072), "kept");
  // Rounded up to 16 columns, and clusters and K tile kept.
  EXPECT_EQ(widened("pingpong_64x16x256_c2x1_persistent_swap", 20, 8192, 4096),
            "pingpong_64x32x256_c2x1_persistent_swap");
  // An untransposed 64-row tile splits 80 rows the same way (214 tiles of 64x48 at
  // 80x5120x3072): the transposed tile holding M instead; not where the row tiles fit one
  // wave, or M fits one row tile.
  EXPECT_EQ(widened("pingpong_64x48x128_c1x1_persistent", 80, 5120, 3072), "pingpong_64x80x128_c1x1_persistent_swap");
  EXPECT_EQ(widened("pingpong_64x160x64_c1x2_persistent", 100, 16384, 2048),
            "pingpong_64x112x128_c1x1_persistent_swap");
  EXPECT_EQ(widened("pingpong_64x64x128_c1x1_persistent", 100, 3072, 8192), "kept");
  // Measured at M = 128, where its two row tiles were the fastest: kept.
  EXPECT_EQ(widened("pingpong_64x160x64_c1x2_persistent", 100, 16384, 2048, 128), "kept");
  EXPECT_EQ(widened("pingpong_64x48x128_c1x1_persistent", 48, 9216, 3072), "kept");
  // One tile across M already, or M beyond the widest transposed tile.
  EXPECT_EQ(widened("pingpong_64x64x128_c1x1_persistent_swap", 56, 16384, 2048), "kept");
  EXPECT_EQ(widened("pingpong_64x64x128_c1x1_persistent_swap", 130, 16384, 2048), "kept");
  EXPECT_EQ(widened("pingpong_128x64x64_c1x1_persistent", 130, 16384, 2048), "kept");
  // Every widened tile is one evtc builds (KernelConfig::parse checks it).
  for (int m = 17; m <= 128; ++m)
    for (const char* config : {"pingpong_64x16x256_c1x1_persistent_swap", "pingpong_64x32x128_c1x1_persistent_swap",
                               "pingpong_64x64x128_c1x2_persistent_swap"})
      if (const auto c = one_token_tile(*KernelConfig::parse(config), gemm(m, 65536, 4096), {132}))
        EXPECT_TRUE(KernelConfig::parse(c->name()).has_value()) << c->name();
}

TEST(SelectionTable, AShapeBetweenTheTablesMValuesSplitsMIntoTransposedCooperativeTiles) {
  auto pick = [](int64_t m, int64_t n) {
    const auto c = mid_m_transposed_tile(gemm(m, n, 4096), {132});
    return c ? c->name() : std::string("none");
  };
  const struct {
    int64_t m, n;
    const char* pick;
  } cases[] = {
      // One tile of M rounded up to 16 columns up to 160 rows, then two (cuBLAS's own choice at
      // 200x7168: two of 104), or three at 300x35840 (560 tiles of 160 fill 0.85 of five
      // waves, 840 of 112 0.91 of seven).
      {88, 11008, "coop_128x96x64_c1x1_persistent_swap"},
      {96, 16384, "coop_128x96x64_c1x1_persistent_swap"},
      {200, 7168, "coop_128x112x64_c1x1_persistent_swap"},
      {300, 35840, "coop_128x112x64_c1x1_persistent_swap"},
      // One tile more across M where the grid fills its waves better: 280x22016 (172 x 2
      // tiles, 1.3 waves of 264 -> 172 x 3 in two) and 240x11008.
      {280, 22016, "coop_128x96x64_c1x1_persistent_swap"},
      {240, 11008, "coop_128x80x64_c1x1_persistent_swap"},
      {176, 28672, "coop_128x96x64_c1x1_persistent_swap"},
      // Fewer tiles than half a wave (short N): the entry's configuration.
      {100, 3072, "none"},
      {72, 8192, "none"},
      // Decode sizes, whole 64-row tiles, and M beyond the rule's range.
      {64, 16384, "none"},
      {192, 16384, "none"},
      {330, 16384, "none"},
  };
  for (const auto& c : cases) EXPECT_EQ(pick(c.m, c.n), c.pick) << c.m << "x" << c.n;
  // Every tile it picks is one evtc builds, and it is among the tuning candidates.
  const Graph plain = parse_expression("out D: bf16 = acc");
  for (int64_t m = 65; m <= 320; ++m) {
    const GemmDesc g = gemm(m, 65536, 4096);
    if (const auto c = mid_m_transposed_tile(g, {132})) {
      EXPECT_TRUE(KernelConfig::parse(c->name()).has_value()) << c->name();
      const auto candidates = tuning::candidate_configs(plain, g, {132}, 0);
      EXPECT_NE(std::find(candidates.begin(), candidates.end(), *c), candidates.end()) << c->name();
    }
  }
}

TEST(SelectionTable, ABorrowedDecodeTileWidensToTheEntrysCountOfTiles) {
  auto entry = [](int64_t m, int64_t n, const char* config) { return table_entry(m, n, 4096, config); };
  auto widened = [](const TableEntry& e, int64_t m, int64_t n) {
    return name_or_kept(entry_tile_count_width(e.config, gemm(m, n, 3072), e, {132}));
  };
  // The M = 64 entry's 64x48 tile ran 96 tiles at N = 4608: 192 at N = 9216 (1.18x cuBLAS on the
  // H200) become 96 of 64x96 (1.02x); 107 at N = 5120 become 80 of 64x64.
  const TableEntry narrow = entry(64, 4608, "pingpong_64x48x128_c1x1_persistent");
  EXPECT_EQ(widened(narrow, 48, 9216), "pingpong_64x96x128_c1x1_persistent");
  EXPECT_EQ(widened(narrow, 16, 9216), "pingpong_64x96x128_c1x1_persistent");
  EXPECT_EQ(widened(narrow, 48, 5120), "pingpong_64x64x128_c1x1_persistent");
  // As many tiles or fewer already (a narrower N, or one whose width rounds to the entry's).
  EXPECT_EQ(widened(narrow, 48, 4544), "kept");
  EXPECT_EQ(widened(narrow, 48, 4608), "kept");
  // M beyond one row tile or decode sizes (rules 5-7 take those), an entry of more rows than its tile.
  EXPECT_EQ(widened(narrow, 80, 9216), "kept");
  EXPECT_EQ(widened(entry(128, 4608, "pingpong_64x48x128_c1x1_persistent"), 48, 9216), "kept");
  // Entries measured in more than one wave (GPT-style widths of 28672 and more run 224-395
  // tiles, the fastest there), in clusters, in K parts, transposed or cooperative: kept.
  EXPECT_EQ(widened(entry(64, 37888, "pingpong_64x96x128_c1x1_persistent"), 48, 40960), "kept");
  EXPECT_EQ(widened(entry(64, 7168, "pingpong_64x64x128_c1x2_persistent"), 48, 9216), "kept");
  EXPECT_EQ(widened(entry(64, 1024, "pingpong_64x160x64_c1x1_persistent_kparts2"), 48, 2048), "kept");
  EXPECT_EQ(widened(entry(64, 4608, "pingpong_64x64x128_c1x1_persistent_swap"), 48, 9216), "kept");
  EXPECT_EQ(widened(entry(64, 4608, "coop_128x64x64_c1x1_persistent"), 48, 9216), "kept");
  // No wider than 256 columns.
  EXPECT_EQ(widened(entry(64, 16384, "pingpong_64x128x128_c1x1_persistent"), 48, 40960), "kept");
  // Every widened tile is one evtc builds; up to 128 columns the tuner would time it too. Wider
  // ones may leave too few main-loop stages: table_choice then keeps the entry's tile.
  const Graph plain = run_pipeline(parse_expression("out D: bf16 = acc"));
  for (int64_t n = 4608; n <= 4608 * 5; n += 160)
    if (const auto c = entry_tile_count_width(narrow.config, gemm(48, n, 4096), narrow, {132})) {
      EXPECT_TRUE(KernelConfig::parse(c->name()).has_value()) << c->name();
      if (c->tile_n <= 128)
        EXPECT_EQ(tuning::prune_reason(*c, plain, gemm(48, n, 4096), {132}), "") << c->name() << " at N = " << n;
    }
  // On the H200's own table.
  const std::optional<DeviceInfo> h200 = DeviceInfo{"NVIDIA H200", 90, 132};
  auto c = table_choice_on(plain, gemm(48, 9216, 3072), h200);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->config.name(), "pingpong_64x96x128_c1x1_persistent");
  EXPECT_EQ(c->entry.config.name(), "pingpong_64x48x128_c1x1_persistent") << "the H200 table changed: pick another shape";
  EXPECT_EQ(c->entry.order.name(), "heuristic");
  c = table_choice_on(plain, gemm(64, 4608, 3584), h200);  // the entry's own shape
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(c->exact);
  EXPECT_EQ(c->config.name(), "pingpong_64x48x128_c1x1_persistent");
}

TEST(SelectionTable, KInPartsNeedsMoreThan512OfKAPart) {
  const Graph plain = run_pipeline(parse_expression("out D: bf16 = acc"));
  const KernelConfig four = *KernelConfig::parse("pingpong_64x16x128_c1x1_persistent_kparts4_swap");
  EXPECT_EQ(tuning::k_split_refusal(four, gemm(16, 1024, 4096)), "");
  EXPECT_EQ(tuning::prune_reason(four, plain, gemm(16, 1024, 4096)), "");
  const std::string why = tuning::k_split_refusal(four, gemm(16, 2048, 2048));
  EXPECT_NE(why.find("K is too short for 4 parts (each would hold 512 of K, under 640)"), std::string::npos) << why;
  EXPECT_EQ(tuning::prune_reason(four, plain, gemm(16, 2048, 2048)), why);
  EXPECT_EQ(tuning::k_split_refusal(*KernelConfig::parse("pingpong_64x16x128_c1x1_persistent_kparts2_swap"),
                                    gemm(16, 2048, 2048)),
            "");
  // 768 a part (GPT-2's 768x3072 projection) measured faster than one part: kept.
  EXPECT_EQ(tuning::k_split_refusal(four, gemm(16, 768, 3072)), "");
  // A 64-deep K tile's four tiles a part are 256 of K: refused too (64x160 in 4 parts at
  // 16x1024x1024 took 1.23x cuBLAS, the transposed 64x16 tile in one part 0.98x).
  EXPECT_NE(tuning::k_split_refusal(*KernelConfig::parse("pingpong_64x160x64_c1x1_persistent_kparts4"),
                                    gemm(16, 1024, 1024)),
            "");
  EXPECT_EQ(tuning::k_split_refusal(*KernelConfig::parse("pingpong_64x16x128_c1x1_persistent_swap"), gemm(16, 2048, 64)),
            "");
  // No candidate splits K shorter than that.
  for (const GemmDesc& g : {gemm(16, 1536, 1536), gemm(16, 2048, 2048), gemm(48, 1024, 3000)})
    for (const KernelConfig& c : tuning::candidate_configs(plain, g, {132}))
      if (c.k_parts > 1) EXPECT_GE(g.k / c.k_parts, tuning::kMinKPerPart) << c.name();
  // The H200 table's K-in-parts entries (M = 16-64 x 1024 x 4096) are passed over at shorter K:
  // 16x2048x2048 took 1.10x cuBLAS in their 4 parts of 512, 0.94x in the nearest other entry's
  // tile; 16x1536x1536 took 1.21x in the untransposed 64x160 fallback, 0.97x in that tile.
  const std::optional<DeviceInfo> h200 = DeviceInfo{"NVIDIA H200", 90, 132};
  for (const GemmDesc& g : {gemm(16, 2048, 2048), gemm(16, 1536, 1536), gemm(48, 2048, 2048)}) {
    const auto c = table_choice_on(plain, g, h200);
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->config.k_parts, 1) << g.m << "x" << g.n << "x" << g.k << ": " << c->config.name();
    EXPECT_TRUE(c->config.swap_ab) << c->config.name();
    EXPECT_NE(c->entry.n, 1024) << "the K-in-parts entry";
  }
  const auto at = table_choice_on(plain, gemm(16, 1024, 4096), h200);
  ASSERT_TRUE(at.has_value());
  EXPECT_EQ(at->config.k_parts, 4) << "the H200 table changed at 16x1024x4096: pick another shape";
  EXPECT_EQ(table_choice_on(plain, gemm(16, 1024, 8192), h200)->config.k_parts, 4);
  EXPECT_EQ(table_choice_on(plain, gemm(16, 768, 3072), h200)->config.k_parts, 4);
}

TEST(SelectionTable, ABorrowedTransposedDecodeTileNarrowsTo16ColumnsOfM) {
  auto narrowed = [](const char* config, int64_t m, int64_t n) {
    return name_or_kept(narrow_decode_transposed_tile(*KernelConfig::parse(config), gemm(m, n, 8192), {132}));
  };
  const char* sixteen = "pingpong_64x16x128_c1x1_persistent_swap";
  // 32 row tiles of N = 2048, M = 48 in three 16-column tiles: 96 tiles, one wave (0.95x
  // cuBLAS on the H200 where the borrowed 64x32 in 4 parts took 1.04x).
  EXPECT_EQ(narrowed("pingpong_64x32x128_c1x1_persistent_kparts4_swap", 48, 2048), sixteen);
  EXPECT_EQ(narrowed("pingpong_64x32x128_c4x1_persistent_swap", 24, 2048), sixteen);
  EXPECT_EQ(narrowed("pingpong_64x32x128_c1x1_persistent_swap", 64, 2048), sixteen);  // 128 tiles
  EXPECT_EQ(narrowed("pingpong_64x32x128_c1x1_persistent_swap", 32, 4096), sixteen);  // 128 tiles
  EXPECT_EQ(narrowed("pingpong_64x16x256_c4x1_persistent_swap", 32, 4096),
            "pingpong_64x16x256_c1x1_persistent_swap");  // the entry's K tile
  EXPECT_EQ(narrowed("coop_128x32x64_c4x1_persistent_swap", 32, 4096), sixteen);
  // Fewer than 32 row tiles of N (N = 1536: 24), more tiles than one wave (M = 48 at N = 3072:
  // 144), M of one 16-column tile or beyond decode sizes, the tile itself, or untransposed: kept.
  EXPECT_EQ(narrowed("pingpong_64x32x128_c1x1_persistent_kparts4_swap", 48, 1536), "kept");
  EXPECT_EQ(narrowed("pingpong_64x32x128_c1x1_persistent_swap", 48, 3072), "kept");
  EXPECT_EQ(narrowed("pingpong_64x16x128_c1x1_persistent_kparts4_swap", 16, 2048), "kept");
  EXPECT_EQ(narrowed("pingpong_64x80x128_c1x1_persistent_swap", 80, 2048), "kept");
  EXPECT_EQ(narrowed(sixteen, 48, 2048), "kept");
  EXPECT_EQ(narrowed("pingpong_64x32x128_c1x1_persistent", 48, 2048), "kept");
  // Every narrowed tile is one the tuner would time too.
  const Graph plain = run_pipeline(parse_expression("out D: bf16 = acc"));
  for (int64_t m = 17; m <= 64; m += 7)
    for (int64_t n = 1900; n <= 8448; n += 300)
      if (const auto c = narrow_decode_transposed_tile(*KernelConfig::parse("pingpong_64x32x128_c4x1_persistent_swap"),
                                                       gemm(m, n, 4096), {132})) {
        EXPECT_EQ(tuning::prune_reason(*c, plain, gemm(m, n, 4096), {132}), "") << m << "x" << n;
        EXPECT_LE(tuning::tile_count(*c, gemm(m, n, 4096)), 132);
      }
  // On the H200's own table: borrowers of the K-in-parts and clustered entries narrow; the
  // entries' own shapes keep their configurations.
  const std::optional<DeviceInfo> h200 = DeviceInfo{"NVIDIA H200", 90, 132};
  for (const GemmDesc& g : {gemm(48, 2048, 8192), gemm(24, 2048, 8192), gemm(40, 2048, 8192), gemm(40, 2040, 2000)}) {
    const auto c = table_choice_on(plain, g, h200);
    ASSERT_TRUE(c.has_value());
    EXPECT_FALSE(c->exact);
    EXPECT_EQ(c->config.name(), sixteen) << g.m << "x" << g.n << "x" << g.k << " from " << c->entry.config.name();
    EXPECT_EQ(c->entry.order.name(), "heuristic");
  }
  const auto own = table_choice_on(plain, gemm(32, 3584, 4096), h200);
  ASSERT_TRUE(own.has_value());
  EXPECT_TRUE(own->exact);
  EXPECT_EQ(own->config.name(), own->entry.config.name());
  EXPECT_NE(own->config.name(), sixteen) << "the H200 table changed at 32x3584x4096: pick another shape";
}

TEST(SelectionTable, AnUntransposedEntryOfMoreRowsLendsTheTransposedTileHoldingM) {
  auto entry = [](int64_t m, const char* config) { return table_entry(m, 4608, 3584, config); };
  auto transposed = [](const TableEntry& e, int64_t m, int64_t n) {
    return name_or_kept(transposed_tile_below_the_entrys_rows(e.config, gemm(m, n, 4096), e, {132}));
  };
  const TableEntry m64 = entry(64, "pingpong_64x48x128_c1x1_persistent");
  // 48x4544x4544 took 1.14x cuBLAS on the H200 with the entry's tile, 1.01x with 71 transposed
  // 64x48 tiles.
  EXPECT_EQ(transposed(m64, 48, 4544), "pingpong_64x48x128_c1x1_persistent_swap");
  EXPECT_EQ(transposed(m64, 33, 5120), "pingpong_64x48x128_c1x1_persistent_swap");
  EXPECT_EQ(transposed(entry(64, "pingpong_64x64x128_c1x1_persistent"), 40, 5120),
            "pingpong_64x48x128_c1x1_persistent_swap");
  // M = 56 (no faster transposed), M of 32 or fewer, an entry of no more rows, more tiles than
  // one wave (N = 9216: 144), clusters or K parts, transposed or cooperative entries: kept.
  EXPECT_EQ(transposed(m64, 56, 4544), "kept");
  EXPECT_EQ(transposed(m64, 32, 4544), "kept");
  EXPECT_EQ(transposed(entry(48, "pingpong_64x48x128_c1x1_persistent"), 48, 4544), "kept");
  EXPECT_EQ(transposed(m64, 48, 9216), "kept");
  EXPECT_EQ(transposed(entry(64, "pingpong_64x64x128_c1x2_persistent"), 48, 5120), "kept");
  EXPECT_EQ(transposed(entry(64, "pingpong_64x160x64_c1x1_persistent_kparts2"), 48, 2048), "kept");
  EXPECT_EQ(transposed(entry(64, "pingpong_64x32x128_c1x1_persistent_swap"), 48, 4544), "kept");
  EXPECT_EQ(transposed(entry(64, "coop_128x64x64_c1x1_persistent"), 48, 4544), "kept");
  // On the H200's own table: before rule 8 (which widened the entry's 64x48 to 64x64 here).
  const Graph plain = run_pipeline(parse_expression("out D: bf16 = acc"));
  const std::optional<DeviceInfo> h200 = DeviceInfo{"NVIDIA H200", 90, 132};
  for (const GemmDesc& g : {gemm(48, 4544, 4544), gemm(48, 5120, 4096), gemm(46, 4600, 3600)}) {
    const auto c = table_choice_on(plain, g, h200);
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->config.name(), "pingpong_64x48x128_c1x1_persistent_swap")
        << g.m << "x" << g.n << "x" << g.k << " from " << c->entry.config.name();
    EXPECT_EQ(c->entry.m, 64) << "the H200 table changed: pick another shape";
  }
}

TEST(SelectionTable, BorrowedKInPartsKeepsThePartsOfOneWave) {
  auto cut = [](const char* config, int64_t m, int64_t n, int64_t k) {
    return name_or_kept(parts_within_one_wave(*KernelConfig::parse(config), gemm(m, n, k), {132}));
  };
  const char* four = "pingpong_64x32x128_c1x1_persistent_kparts4_swap";
  // N = 1536 at M = 48: 24 x 2 tiles in 4 parts are 192 units, two waves (1.11x cuBLAS on the
  // H200); in 2 parts 96 (1.04x).
  EXPECT_EQ(cut(four, 48, 1536, 8960), "pingpong_64x32x128_c1x1_persistent_kparts2_swap");
  // 36 tiles: three parts of 1024 fit one wave.
  EXPECT_EQ(cut(four, 72, 768, 3072), "pingpong_64x32x128_c1x1_persistent_kparts3_swap");
  // Three parts fit but do not split K = 4096 evenly into 16-byte slices of 640 or more: two.
  EXPECT_EQ(cut(four, 72, 1024, 4096), "pingpong_64x32x128_c1x1_persistent_kparts2_swap");
  // More than 66 tiles (35 x 2 here): K whole.
  EXPECT_EQ(cut(four, 48, 2240, 8192), "pingpong_64x32x128_c1x1_persistent_swap");
  // Parts within one wave, or none: kept.
  EXPECT_EQ(cut(four, 32, 1536, 8960), "kept");
  EXPECT_EQ(cut(four, 64, 1024, 4096), "kept");
  EXPECT_EQ(cut("pingpong_64x32x128_c1x1_persistent_swap", 64, 8192, 8192), "kept");
  const Graph plain = run_pipeline(parse_expression("out D: bf16 = acc"));
  const std::optional<DeviceInfo> h200 = DeviceInfo{"NVIDIA H200", 90, 132};
  const auto c = table_choice_on(plain, gemm(48, 1536, 8960), h200);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->config.name(), "pingpong_64x32x128_c1x1_persistent_kparts2_swap");
  EXPECT_EQ(c->entry.config.name(), four) << "the H200 table changed: pick another shape";
}

TEST(SelectionTable, BorrowedRowTilesAcrossMBecomeTransposedTilesSplittingM) {
  auto turned = [](const char* config, int64_t m, int64_t n, int64_t k) {
    return name_or_kept(transposed_tiles_across_m(*KernelConfig::parse(config), gemm(m, n, k), {132}));
  };
  const char* pair = "pingpong_64x64x128_c1x1_persistent";
  // 96x3584x18944 took 1.41x cuBLAS on the H200 with the M = 128 entry's two 64-row tiles, 0.92x
  // with 56 transposed 64x96 tiles in 2 parts (112 units; 3 parts would be 168).
  EXPECT_EQ(turned(pair, 96, 3584, 18944), "pingpong_64x96x128_c1x1_persistent_kparts2_swap");
  // 32 tiles of 64x112 at N = 2048: 4 parts (the most taken), 2048 of K each.
  EXPECT_EQ(turned("pingpong_64x32x128_c1x1_persistent", 112, 2048, 8192),
            "pingpong_64x112x128_c1x1_persistent_kparts4_swap");
  EXPECT_EQ(turned(pair, 112, 2048, 12000), "pingpong_64x112x128_c1x1_persistent_kparts4_swap");
  // Parts that do not split K into 16-byte slices: fewer parts (10000 / 4 = 2500), or K whole.
  EXPECT_EQ(turned(pair, 112, 2048, 10000), "pingpong_64x112x128_c1x1_persistent_kparts2_swap");
  EXPECT_EQ(turned(pair, 112, 2048, 8200), "pingpong_64x112x128_c1x1_persistent_swap");
  // 80 tiles: no two parts fit one wave, K whole; K under 8192: K whole.
  EXPECT_EQ(turned("pingpong_64x128x64_c1x1_persistent", 104, 5120, 13824), "pingpong_64x112x128_c1x1_persistent_swap");
  EXPECT_EQ(turned(pair, 96, 4096, 4096), "pingpong_64x96x128_c1x1_persistent_swap");
  // An entry in clusters: 68x3584x18944 took 1.84x with the 64x64 tile in 1x2 clusters.
  EXPECT_EQ(turned("pingpong_64x64x128_c1x2_persistent", 68, 3584, 18944),
            "pingpong_64x80x128_c1x1_persistent_kparts2_swap");
  // Two tiles across 129-224 rows: 144x4096x4096 1.87x -> 0.98x with 128 transposed 64x80 tiles;
  // 192x2048x8192 1.15x -> 0.84x with 64 tiles of 64x96 in 2 parts.
  EXPECT_EQ(turned(pair, 144, 4096, 4096), "pingpong_64x80x128_c1x1_persistent_swap");
  EXPECT_EQ(turned("pingpong_64x80x128_c1x1_persistent", 160, 3072, 2048), "pingpong_64x80x128_c1x1_persistent_swap");
  EXPECT_EQ(turned("pingpong_64x32x128_c1x1_persistent", 192, 2048, 8192),
            "pingpong_64x96x128_c1x1_persistent_kparts2_swap");
  EXPECT_EQ(turned("pingpong_64x32x128_c1x1_persistent", 160, 1536, 8960),
            "pingpong_64x80x128_c1x1_persistent_kparts2_swap");
  EXPECT_EQ(turned(pair, 224, 3072, 4096), "pingpong_64x112x128_c1x1_persistent_swap");
  // M of 64 or fewer, 113-128 (116x3072x8192: 1.035x kept, 1.067x turned) or above 224, more
  // transposed tiles than a wave (N = 9216 at M = 96: 144; N = 5120 at M = 160: 160), and
  // entries transposed, in parts or cooperative: kept.
  EXPECT_EQ(turned(pair, 64, 4096, 11008), "kept");
  EXPECT_EQ(turned(pair, 116, 3072, 8192), "kept");
  EXPECT_EQ(turned(pair, 128, 4096, 14336), "kept");
  EXPECT_EQ(turned(pair, 232, 3584, 18944), "kept");
  EXPECT_EQ(turned(pair, 96, 9216, 8192), "kept");
  EXPECT_EQ(turned(pair, 160, 5120, 4096), "kept");
  EXPECT_EQ(turned("pingpong_64x80x128_c1x1_persistent_swap", 80, 4096, 14336), "kept");
  EXPECT_EQ(turned("pingpong_64x160x64_c1x1_persistent_kparts2", 96, 2048, 8192), "kept");
  EXPECT_EQ(turned("coop_128x64x64_c1x1_persistent", 96, 2048, 8192), "kept");
  // Every tile turned to passes the candidates' pruning and fits one wave.
  const Graph plain = run_pipeline(parse_expression("out D: bf16 = acc"));
  for (int64_t m = 65; m <= 224; m += 7)
    for (int64_t n : {1024, 2048, 3072, 4096, 5120, 8192})
      for (int64_t k : {2048, 4096, 8192, 11008, 14336, 18944}) {
        const auto c = transposed_tiles_across_m(*KernelConfig::parse(pair), gemm(m, n, k), {132});
        if (!c) continue;
        EXPECT_EQ(tuning::prune_reason(*c, plain, gemm(m, n, k), {132}), "") << c->name() << " at " << m << "x" << n;
        EXPECT_LE(tuning::tile_count(*c, gemm(m, n, k)) * c->k_parts, 132) << c->name() << " at " << m << "x" << n;
      }
  // On the H200's own table.
  const std::optional<DeviceInfo> h200 = DeviceInfo{"NVIDIA H200", 90, 132};
  const auto c = table_choice_on(plain, gemm(96, 4096, 11008), h200);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->config.name(), "pingpong_64x96x128_c1x1_persistent_kparts2_swap");
  EXPECT_EQ(c->entry.config.name(), pair) << "the H200 table changed: pick another shape";
  const auto two = table_choice_on(plain, gemm(144, 4096, 4096), h200);
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->config.name(), "pingpong_64x80x128_c1x1_persistent_swap") << "from " << two->entry.config.name();
}

TEST(SelectionTable, AGpuClassIsAskedForWithoutOne) {
  EXPECT_EQ(gpu_classes(), (std::vector<std::string>{"h100", "h200"}));
  const auto h200 = device_of_class("h200");
  ASSERT_TRUE(h200.has_value());
  EXPECT_EQ(h200->name, "NVIDIA H200");
  EXPECT_EQ(h200->arch, 90);
  EXPECT_EQ(h200->sm_count, 132);
  EXPECT_EQ(gpu_class_of(device_of_class("h100")->name), "h100");
  EXPECT_FALSE(device_of_class("a100").has_value());
  EXPECT_FALSE(device_of_class("").has_value());
  // default_config as on that GPU: its table's choice (rule 10's transposed 64x16 tile at
  // 48x2048x8192), else the rules for its multiprocessors; without a GPU, the rules.
  const Graph plain = run_pipeline(parse_expression("out D: bf16 = acc"));
  GemmDesc g = gemm(48, 2048, 8192);
  g.sm = 90;
  EXPECT_EQ(default_config_on(plain, g, h200).name(), table_choice_on(plain, g, h200)->config.name());
  EXPECT_EQ(default_config_on(plain, g, h200).name(), "pingpong_64x16x128_c1x1_persistent_swap");
  EXPECT_EQ(default_config_on(plain, g, std::nullopt).name(), default_config_for_shape_on(plain, g, {132}).name());
  EXPECT_NE(default_config_on(plain, g, std::nullopt).name(), "pingpong_64x16x128_c1x1_persistent_swap");
  // A Kernel's options add what they add whatever the choice.
  CompileOptions precise;
  precise.precise_math = true;
  EXPECT_TRUE(with_kernel_options(default_config_on(plain, g, h200), precise).precise_math);
}

TEST(SelectionTable, GpuClassesAndDtypes) {
  EXPECT_EQ(gpu_class_of("NVIDIA H100 80GB HBM3"), "h100");
  EXPECT_EQ(gpu_class_of("NVIDIA H200"), "h200");
  EXPECT_EQ(gpu_class_of("NVIDIA A100-SXM4-80GB"), "");
  EXPECT_EQ(table_for("", DType::bf16), nullptr);
  // fp8 (e4m3) has its own tables, measured with row-wise scales; e5m2 none.
  if (const SelectionTable* fp8 = table_for("h200", DType::f8e4m3)) {
    EXPECT_EQ(fp8->dtype, DType::f8e4m3);
    EXPECT_NE(fp8, table_for("h200", DType::bf16));
    EXPECT_EQ(table_for("h200", DType::f8e5m2, fp8->sm_count), nullptr);
  }
  if (const SelectionTable* t = table_for("h100", DType::bf16)) {
    EXPECT_EQ(table_for("h100", DType::f16), t);
    // A class without a table of its own borrows one measured on as many multiprocessors.
    const SelectionTable* borrowed = table_for("a class without a table", DType::bf16, t->sm_count);
    ASSERT_NE(borrowed, nullptr);
    EXPECT_EQ(borrowed->sm_count, t->sm_count);
    EXPECT_EQ(table_for("a class without a table", DType::bf16, t->sm_count - 18), nullptr);
  }
  // A class with its own table takes it, whatever other tables share its multiprocessor count.
  for (const char* cls : {"h100", "h200"})
    if (const SelectionTable* t = table_for(cls, DType::bf16, 0)) {
      EXPECT_EQ(t->gpu_class, cls);
      EXPECT_EQ(table_for(cls, DType::bf16, t->sm_count), t);
    }
}

TEST(SelectionTable, NoTableWithoutAGpuOrForOtherEpilogues) {
  // CPU machines have no device: the defaults are the rules', whatever the tables hold.
  GemmDesc g;
  g.m = 64;
  g.n = 4096;
  g.k = 4096;
  g.b_layout = Layout::col_major;
  EXPECT_FALSE(table_choice(run_pipeline(parse_expression("out D: bf16 = acc")), g).has_value());
  EXPECT_FALSE(light_epilogue(run_pipeline(parse_expression("out D: bf16 = acc * r[m,n]"))));
  EXPECT_FALSE(light_epilogue(run_pipeline(parse_expression("out D: bf16 = acc; out s = row_sum(acc)"))));
  EXPECT_TRUE(light_epilogue(run_pipeline(parse_expression("out D: bf16 = silu(acc + bias[n])"))));
}

TEST(SelectionTable, DecodeSizedEntriesTakeHeavierEpiloguesWithoutReductionsOnSmallTiles) {
  const Graph residual = run_pipeline(parse_expression("out D: bf16 = acc + r[m,n]"));
  const Graph two = run_pipeline(parse_expression("out y: f32 = acc + r[m,n]\nout D: bf16 = silu(acc) * r[m,n]"));
  const Graph reduces = run_pipeline(parse_expression("out D: bf16 = acc + r[m,n]; out s = row_sum(acc)"));
  EXPECT_TRUE(decode_table_epilogue(residual, gemm(64, 4096, 4096)));
  EXPECT_TRUE(decode_table_epilogue(two, gemm(13, 4096, 4096)));
  EXPECT_FALSE(decode_table_epilogue(residual, gemm(65, 4096, 4096)));  // past decode sizes
  EXPECT_FALSE(decode_table_epilogue(reduces, gemm(16, 4096, 4096)));   // reductions keep their rules
  // Accumulators a thread: 64x128 ping-pong 64, transposed 64x16 8, cooperative 128x128 64;
  // ping-pong 64x160 80 and 128x192 192 are not small.
  for (const char* small : {"pingpong_64x128x128_c1x1_persistent", "pingpong_64x16x256_c1x1_persistent_swap",
                            "coop_128x128x64_c1x1_persistent"})
    EXPECT_TRUE(few_accumulators(*KernelConfig::parse(small))) << small;
  for (const char* big : {"pingpong_64x160x64_c1x1_persistent", "pingpong_128x192x64_c2x1_persistent"})
    EXPECT_FALSE(few_accumulators(*KernelConfig::parse(big))) << big;
}

TEST(SelectionTable, BRowMajorTakesTheEntriesUpTo128RowsAndFrom1024On) {
  GemmDesc g = gemm(kOtherLayoutRows, 1600, 6400);
  g.b_layout = Layout::row_major;  // GPT-2's Conv1D weight, or W in dY·W
  EXPECT_TRUE(other_layout_entries(g));
  g.m = kOtherLayoutRows - 1;
  EXPECT_FALSE(other_layout_entries(g));
  g.m = kOtherLayoutSmallRows + 1;
  EXPECT_FALSE(other_layout_entries(g));
  for (int64_t m : {int64_t(1), int64_t(64), kOtherLayoutSmallRows}) {  // GPT-2 decoding m sequences
    g.m = m;
    EXPECT_TRUE(other_layout_entries(g)) << m;
  }
  g.m = 8192;
  g.a_layout = Layout::col_major;  // a weight gradient: keeps the rules
  EXPECT_FALSE(other_layout_entries(g));
  g.a_layout = Layout::row_major;
  g.a_dtype = g.b_dtype = DType::f8e4m3;  // fp8 has only its own layout's measurements
  EXPECT_FALSE(other_layout_entries(g));
}

TEST(SelectionTable, OnAnH200ResidualsAndBRowMajorTakeTheirEntries) {
  // What an H200 chooses (no GPU needed: the device is given, the tables are embedded).
  const std::optional<DeviceInfo> h200 = DeviceInfo{"NVIDIA H200", 90, 132};
  const Graph residual = run_pipeline(parse_expression("out D: bf16 = acc + r[m,n]"));
  const Graph plain = run_pipeline(parse_expression("out D: bf16 = acc"));
  const SelectionTable* residual_table = shipped_table_named("h200-bf16-residual.json");
  const SelectionTable* plain_table = shipped_table_named("h200-bf16.json");
  ASSERT_NE(residual_table, nullptr);
  ASSERT_NE(plain_table, nullptr);
  auto entry_of = [](const SelectionTable* t, int64_t m, int64_t n, int64_t k) {
    for (const TableEntry& e : t->entries)
      if (e.m == m && e.n == n && e.k == k) return e.config.name();
    return std::string("none");
  };
  // A residual at a measured shape takes that shape's residual entry.
  auto c = table_choice_on(residual, gemm(8192, 2048, 2048), h200);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->table, "h200-bf16-residual.json");
  EXPECT_TRUE(c->exact);
  EXPECT_EQ(c->config.name(), entry_of(residual_table, 8192, 2048, 2048));
  // Off the table's shapes, from its smallest M on: its nearest entry.
  c = table_choice_on(residual, gemm(3000, 5120, 14336), h200);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->table, "h200-bf16-residual.json");
  EXPECT_FALSE(c->exact);
  // Below it (and above decode sizes) the rules: no table.
  EXPECT_FALSE(table_choice_on(residual, gemm(512, 4096, 4096), h200).has_value());
  // D = acc keeps the plain table.
  c = table_choice_on(plain, gemm(8192, 4096, 4096), h200);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->table, "h200-bf16.json");
  EXPECT_EQ(c->config.name(), entry_of(plain_table, 8192, 4096, 4096));
  // B row-major: the same entries up to 128 rows and from 1024 on, the rules between; A
  // column-major the rules.
  GemmDesc rr = gemm(8192, 4096, 4096);
  rr.b_layout = Layout::row_major;
  c = table_choice_on(plain, rr, h200);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->config.name(), entry_of(plain_table, 8192, 4096, 4096));
  for (int64_t m : {16, 64, 128}) {
    rr.m = m;
    c = table_choice_on(plain, rr, h200);
    ASSERT_TRUE(c.has_value()) << m;
    EXPECT_TRUE(c->exact) << m;
    EXPECT_EQ(c->config.name(), entry_of(plain_table, m, 4096, 4096)) << m;
  }
  rr.m = 256;
  EXPECT_FALSE(table_choice_on(plain, rr, h200).has_value());
  GemmDesc cr = gemm(8192, 4096, 4096);
  cr.a_layout = Layout::col_major;
  cr.b_layout = Layout::row_major;
  EXPECT_FALSE(table_choice_on(plain, cr, h200).has_value());
  c = table_choice_on(residual, [] { GemmDesc g = gemm(8192, 1600, 6400); g.b_layout = Layout::row_major; return g; }(),
                      h200);
  ASSERT_TRUE(c.has_value());  // GPT-2's Conv1D projection with its residual
  EXPECT_EQ(c->config.name(), entry_of(residual_table, 8192, 1600, 6400));
  // An H100 borrows the H200's residual table (same multiprocessors); another architecture none.
  c = table_choice_on(residual, gemm(8192, 2048, 2048), DeviceInfo{"NVIDIA H100 80GB HBM3", 90, 132});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->table, "h200-bf16-residual.json");
  EXPECT_FALSE(table_choice_on(residual, gemm(8192, 2048, 2048), DeviceInfo{"NVIDIA A100", 80, 108}).has_value());
  EXPECT_FALSE(table_choice_on(residual, gemm(8192, 2048, 2048), std::nullopt).has_value());
}

TEST(SelectionTable, ARowMajorBPassesOverEntriesWhoseTilesItWouldStageWithANarrowSwizzle) {
  const std::optional<DeviceInfo> h200 = DeviceInfo{"NVIDIA H200", 90, 132};
  const Graph residual = run_pipeline(parse_expression("out D: bf16 = acc + r[m,n]"));
  // GPT-2's MLP down projection with its residual: the residual table's own entry there is
  // ping-pong 128x144, measured with B column-major; a row-major B of 144 columns (288 bytes)
  // would be staged with a 32-byte swizzle.
  GemmDesc rc = gemm(4096, 1600, 6400);
  auto c = table_choice_on(residual, rc, h200);
  ASSERT_TRUE(c.has_value());
  ASSERT_EQ(c->config.tile_n, 144) << "the residual table's entry at 4096x1600x6400 changed: pick another shape";
  EXPECT_TRUE(c->exact);
  EXPECT_EQ(tuning::operand_layout_refusal(c->config, rc), "");
  GemmDesc rr = rc;
  rr.b_layout = Layout::row_major;
  const std::string why = tuning::operand_layout_refusal(c->config, rr);
  EXPECT_NE(why.find("reads B row-major"), std::string::npos) << why;
  EXPECT_NE(why.find("144 tile columns of bf16 make 288-byte rows"), std::string::npos) << why;
  EXPECT_NE(tuning::prune_reason(c->config, residual, rr).find("32 bytes wide"), std::string::npos);
  // The lookup takes the nearest entry whose tiles the layout keeps instead.
  c = table_choice_on(residual, rr, h200);
  ASSERT_TRUE(c.has_value());
  EXPECT_FALSE(c->exact);
  EXPECT_EQ(c->table, "h200-bf16-residual.json");
  EXPECT_EQ(tuning::operand_layout_refusal(c->config, rr), "") << c->config.name();
  // Widths of a multiple of 64 bytes keep every layout; a transposed kernel reads Bᵀ as its A
  // (column-major: its 64-row tiles are 128 bytes) and a row-major Aᵀ as its B.
  KernelConfig wide = KernelConfig::of(MainloopSchedule::pingpong, 128, 160, 2);
  EXPECT_EQ(tuning::operand_layout_refusal(wide, rr), "");
  KernelConfig swapped = KernelConfig::of(MainloopSchedule::pingpong, 64, 16, 1);
  swapped.swap_ab = true;
  EXPECT_EQ(tuning::operand_layout_refusal(swapped, rr), "");  // A row-major: Aᵀ is K-major
  GemmDesc cr = rr;
  cr.a_layout = Layout::col_major;  // a weight gradient: Aᵀ is read along the kernel's N
  EXPECT_NE(tuning::operand_layout_refusal(swapped, cr).find("16 tile columns of bf16 make 32-byte rows"),
            std::string::npos);
  // And the tuner never times such a tile.
  for (const KernelConfig& k : tuning::candidate_configs(residual, rr))
    EXPECT_EQ(tuning::operand_layout_refusal(k, rr), "") << k.name();
}

TEST(SelectionTable, AMeasurementHoldsAtItsShapeAndAtItsWeightsOnTheSameTileGrid) {
  // What lets a GEMM with nothing to fuse leave cuBLAS (FusionEstimate::measured): the 16-row
  // entry's transposed 64x16 tile holds M = 9..16 in one 16-column tile, as it held 16.
  TableChoice t;
  t.entry.m = 16;
  t.entry.n = 4096;
  t.entry.k = 4096;
  t.entry.config = *KernelConfig::parse("pingpong_64x16x256_c1x1_persistent_swap");
  t.config = t.entry.config;
  EXPECT_TRUE(measured_here(t, gemm(13, 4096, 4096)));
  EXPECT_TRUE(measured_here(t, gemm(9, 4096, 4096)));
  EXPECT_FALSE(measured_here(t, gemm(24, 4096, 4096)));  // two tiles across M: another grid
  EXPECT_FALSE(measured_here(t, gemm(16, 2048, 4096)));  // other weights: the model's scaling only
  EXPECT_FALSE(measured_here(t, gemm(16, 4096, 2048)));
  TableChoice adapted = t;  // a configuration adapted to the shape was not measured
  adapted.config = *KernelConfig::parse("pingpong_64x32x256_c1x1_persistent_swap");
  EXPECT_FALSE(measured_here(adapted, gemm(13, 4096, 4096)));
  TableChoice exact = t;
  exact.exact = true;
  EXPECT_TRUE(measured_here(exact, gemm(16, 4096, 4096)));
}

TEST(SelectionTable, AMeasurementCarriesToOtherWeightsWhereTheNearestEntriesAllAgree) {
  // The H200 tables' own entries (embedded in the library; no GPU needed to read them).
  auto choice = [](const char* file, int64_t m, int64_t n, int64_t k) {
    const SelectionTable* table = shipped_table_named(file);
    EXPECT_NE(table, nullptr) << file;
    const auto found = match(*table, m, n, k, 132);
    EXPECT_TRUE(found.has_value());
    return TableChoice{found->entry->config, *found->entry, found->exact, table->file};
  };
  // fp8 at M = 16: every nearby entry measured evtc's kernel well ahead of torch._scaled_mm.
  GemmDesc fp8 = gemm(16, 4096, 4096);
  fp8.a_dtype = fp8.b_dtype = DType::f8e4m3;
  const TableChoice near_fp8 = choice("h200-fp8.json", 16, 4096, 4096);
  EXPECT_FALSE(near_fp8.exact);
  EXPECT_TRUE(measured_here(near_fp8, fp8));
  for (const TableEntry* e : nearest_in_n_and_k(*shipped_table_named("h200-fp8.json"), 16, 4096, 4096, 3))
    EXPECT_TRUE(ahead_by_margin(e->ms * 1e3, e->cublas_ms * 1e3)) << e->n << "x" << e->k;
  // bf16 at M = 64 around 2048x2048: the entries disagree (64x1024x4096 measured evtc behind).
  const TableChoice near_bf16 = choice("h200-bf16.json", 64, 2048, 2048);
  EXPECT_FALSE(near_bf16.exact);
  EXPECT_FALSE(measured_here(near_bf16, gemm(64, 2048, 2048)));
  // The margin is the cost model's: 3 %, and at least 0.5 us.
  EXPECT_TRUE(ahead_by_margin(90, 100));
  EXPECT_FALSE(ahead_by_margin(97.5, 100));
  EXPECT_FALSE(ahead_by_margin(9.6, 10));
  EXPECT_TRUE(ahead_by_margin(9.4, 10));
}

}  // namespace

namespace {

TEST(SelectionConfigs, ReductionsRefuseAGivenStreamKOrSplitKConfiguration) {
  for (const char* name : {"coop_128x128x64_c1x1_streamk", "coop_128x128x64_c1x1_splitk4"}) {
    CompileOptions o;
    o.gemm.b_layout = Layout::col_major;
    o.config = KernelConfig::parse(name);
    try {
      Kernel k(parse_expression("out D: bf16 = acc; out rs = row_sum(acc)"), o);
      ADD_FAILURE() << name << " was taken";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("which an epilogue with reductions ('rs') cannot take"), std::string::npos)
          << e.what();
    }
    // Without reductions it is taken.
    EXPECT_NO_THROW(Kernel(parse_expression("out D: bf16 = silu(acc)"), o)) << name;
  }
}

}  // namespace
