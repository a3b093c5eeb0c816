// Autotuning on the GPU: candidates compiled and timed on scratch outputs (the caller's
// outputs stay untouched), the winner persisted and reused by later Kernels, nearest-shape
// reuse, first-call tuning, and correct results (reductions included) after tuning.
// Its own executable: it tunes in a fresh cache folder, apart from the main GPU suite.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "evtc/expression.hpp"
#include "evtc/reference.hpp"
#include "evtc/runtime.hpp"
#include "runtime/selection/tuning_store.hpp"
#include "testing/harness.hpp"

using namespace evtc;

namespace {

// Bias, activation, an extra output and a row reduction: tuning must leave all of them right.
constexpr const char* kEpilogue = R"(
f = acc + bias[n]
out D: bf16 = silu(f)
out rows = row_sum(f)
)";

class AutotunerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cache_ = std::filesystem::temp_directory_path() / ("evtc-tuner-test-" + std::to_string(getpid()));
    setenv("EVTC_CACHE_DIR", cache_.c_str(), 1);
    unsetenv("EVTC_TUNE");
    unsetenv("EVTC_TUNE_MAX_CANDIDATES");
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(cache_); }

  static CompileOptions options(TuneMode mode) {
    CompileOptions o;
    o.tune_mode = mode;
    o.tune_max_candidates = 2;
    return o;
  }

  static void expect_matches_reference(const Kernel& k, const runtime::DeviceProblem& p,
                                       const ReferenceInputs& in) {
    const ReferenceOutputs got = p.read_outputs(nullptr);
    for (const auto& c : runtime::check_outputs(k, got, evaluate_reference(k.graph(), in)))
      EXPECT_TRUE(c.comparison.pass) << "output " << c.name << ": " << c.comparison.describe();
  }

  static inline std::filesystem::path cache_;
};

TEST_F(AutotunerTest, TimesOnScratchPersistsAndRunsCorrectly) {
  const Graph g = parse_expression(kEpilogue);
  Kernel kernel(g, options(TuneMode::ahead));
  const int64_t m = 1000, n = 1016, kk = 520;  // not tile multiples
  const ReferenceInputs in = random_reference_inputs(kernel.graph(), m, n, kk, DType::bf16, DType::bf16, 7);
  runtime::DeviceProblem problem(kernel, in);
  problem.poison_outputs(nullptr);

  const TuneResult r = kernel.tune(problem.arguments());
  ASSERT_EQ(r.candidates.size(), 2u);
  EXPECT_GT(r.best_ms, 0);
  // Every candidate ran and was timed, and the best is the fastest of them.
  const TuneResult::Candidate* fastest = nullptr;
  for (const auto& c : r.candidates) {
    EXPECT_GT(c.median_ms, 0) << c.config.name() << ": " << c.error;
    EXPECT_TRUE(c.error.empty()) << c.config.name() << ": " << c.error;
    if (c.median_ms > 0 && (!fastest || c.median_ms < fastest->median_ms)) fastest = &c;
  }
  ASSERT_NE(fastest, nullptr);
  EXPECT_EQ(r.best, fastest->config);
  // Then every visiting order was timed on the best configuration: the one kept is CUTLASS's,
  // or one at least 1 % faster than it, and best_ms is the kept order's time.
  ASSERT_EQ(r.orders.size(), VisitOrder::all().size());
  double heuristic_ms = -1, kept_ms = -1;
  for (const auto& o : r.orders) {
    EXPECT_GT(o.median_ms, 0) << o.order.name();
    if (o.order == VisitOrder{}) heuristic_ms = o.median_ms;
    if (o.order == r.best_order) kept_ms = o.median_ms;
  }
  EXPECT_DOUBLE_EQ(r.best_ms, kept_ms);
  if (r.best_order != VisitOrder{}) EXPECT_LT(kept_ms, heuristic_ms * 0.99) << r.best_order.name();
  EXPECT_TRUE(std::filesystem::exists(r.record_path));

  // Tuning wrote only to scratch: every output still holds the poison (NaN).
  for (const auto& [name, values] : problem.read_outputs(nullptr))
    for (double v : values) ASSERT_TRUE(std::isnan(v)) << name << " was written during tuning";

  const ConfigChoice choice = kernel.config_choice(m, n, kk);
  EXPECT_EQ(choice.source, ConfigChoice::Source::tuned);
  EXPECT_EQ(choice.config, r.best);
  EXPECT_EQ(choice.order, r.best_order);
  EXPECT_EQ(kernel.run(problem.arguments()), ExecutionPath::fused);
  expect_matches_reference(kernel, problem, in);

  // A new Kernel of the same epilogue finds the persisted choice; a near shape borrows it.
  Kernel again(g, options(TuneMode::ahead));
  EXPECT_EQ(again.config_choice(m, n, kk).source, ConfigChoice::Source::tuned);
  EXPECT_EQ(again.config_choice(m, n, kk).config, r.best);
  EXPECT_EQ(again.config_choice(m, n, kk).order, r.best_order);
  const ConfigChoice near = again.config_choice(m, n, 1040);
  EXPECT_EQ(near.source, ConfigChoice::Source::nearest_tuned);
  EXPECT_EQ(near.tuned_k, kk);
  EXPECT_EQ(near.order, VisitOrder{}) << "an order measured at another shape is not borrowed";
  // Tuning off ignores it.
  Kernel off(g, options(TuneMode::off));
  EXPECT_EQ(off.config_choice(m, n, kk).source, ConfigChoice::Source::heuristic);

  // A transposed choice tuned at a smaller M (a record of this epilogue and GPU, written as the
  // tuner writes them), borrowed by M = 80, where its 64-column tiles would take two across M in
  // 160 tiles, more than one wave: widened to one tile across M, as a table entry's is.
  std::stringstream text;
  text << std::ifstream(r.record_path).rdbuf();
  tuning::TuningRecord decode = tuning::TuningRecord::from_json(text.str());
  decode.m = 64;
  decode.n = 5120;
  decode.k = 3072;
  decode.best = *KernelConfig::parse("pingpong_64x64x128_c1x1_persistent_swap");
  decode.order = VisitOrder{};
  decode.identity.gemm = options(TuneMode::ahead).gemm;  // the record keeps the graph and device; these are the Kernel's
  tuning::TuningStore(cache_.string(), decode.identity).save(decode);
  Kernel later(g, options(TuneMode::ahead));
  const ConfigChoice wide = later.config_choice(80, 5120, 3072);
  EXPECT_EQ(wide.source, ConfigChoice::Source::nearest_tuned);
  EXPECT_EQ(wide.tuned_m, 64);
  EXPECT_EQ(wide.config.name(), "pingpong_64x80x128_c1x1_persistent_swap");
  // At its own shape it stays as tuned.
  EXPECT_EQ(later.config_choice(64, 5120, 3072).config.name(), "pingpong_64x64x128_c1x1_persistent_swap");
}

TEST_F(AutotunerTest, EveryVisitingOrderGivesTheSameResults) {
  // The order only changes which tiles run when: each must write every element, reductions
  // included, at a shape that is not a tile multiple.
  const int64_t m = 1000, n = 1016, kk = 520;
  for (const VisitOrder& order : VisitOrder::all()) {
    CompileOptions o = options(TuneMode::off);
    o.visit_order = order;
    Kernel kernel(parse_expression(kEpilogue), o);
    const ReferenceInputs in = random_reference_inputs(kernel.graph(), m, n, kk, DType::bf16, DType::bf16, 9);
    runtime::DeviceProblem problem(kernel, in);
    problem.poison_outputs(nullptr);
    EXPECT_EQ(kernel.run(problem.arguments()), ExecutionPath::fused) << order.name();
    SCOPED_TRACE(order.name());
    expect_matches_reference(kernel, problem, in);
  }
}

TEST_F(AutotunerTest, FirstCallModeTunesAnUnseenShapeThenRunsIt) {
  Kernel kernel(parse_expression(kEpilogue), options(TuneMode::first_call));
  const int64_t m = 777, n = 1032, kk = 264;
  ASSERT_NE(kernel.config_choice(m, n, kk).source, ConfigChoice::Source::tuned);
  const ReferenceInputs in = random_reference_inputs(kernel.graph(), m, n, kk, DType::bf16, DType::bf16, 8);
  runtime::DeviceProblem problem(kernel, in);
  problem.poison_outputs(nullptr);
  EXPECT_EQ(kernel.run(problem.arguments()), ExecutionPath::fused);
  EXPECT_EQ(kernel.config_choice(m, n, kk).source, ConfigChoice::Source::tuned);
  expect_matches_reference(kernel, problem, in);
}

}  // namespace
