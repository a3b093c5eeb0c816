// evtc tune: autotunes an epilogue ahead of time for a list of problem shapes. The candidates
// of every shape are compiled at once, in parallel; then each shape is timed on random
// inputs on the GPU and its winner is persisted in the cache folder, where every later
// process running this epilogue on this kind of GPU finds it.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/reference.hpp"
#include "evtc/runtime.hpp"
#include "testing/harness.hpp"

namespace evtc::cli {
namespace {

struct TuneArgs {
  std::string expr;
  std::vector<std::string> shapes;
  GemmFlags gemm;
  bool precise = false, list = false;
  int max_candidates = -1;
  std::string json, arch;
};

nlohmann::json result_json(const TuneResult& r) {
  nlohmann::json j{{"m", r.m}, {"n", r.n}, {"k", r.k}, {"best", r.best.name()},
                   {"order", r.best_order.name()}, {"best_ms", r.best_ms}, {"record", r.record_path}};
  j["orders"] = nlohmann::json::array();
  for (const auto& o : r.orders) j["orders"].push_back({{"order", o.order.name()}, {"median_ms", o.median_ms}});
  j["candidates"] = nlohmann::json::array();
  for (const auto& c : r.candidates) {
    nlohmann::json e{{"config", c.config.name()}};
    if (c.median_ms >= 0) e["median_ms"] = c.median_ms;
    else e["error"] = c.error;
    j["candidates"].push_back(e);
  }
  return j;
}

void print_result(const TuneResult& r) {
  fmt::print("{}x{}x{}: best {}, visiting order {} ({:.4f} ms)\n", r.m, r.n, r.k, r.best.name(),
             r.best_order.name(), r.best_ms);
  for (const auto& c : r.candidates) {
    if (c.median_ms >= 0)
      fmt::print("  {:<42} {:.4f} ms{}\n", c.config.name(), c.median_ms,
                 c.config == r.best ? "  <- best" : "");
    else
      fmt::print("  {:<42} failed: {}\n", c.config.name(), c.error.substr(0, 160));
  }
  if (!r.orders.empty()) {
    fmt::print("  visiting orders of {}:\n", r.best.name());
    for (const auto& o : r.orders)
      fmt::print("    {:<14} {:.4f} ms{}\n", o.order.name(), o.median_ms, o.order == r.best_order ? "  <- kept" : "");
  }
  fmt::print("  saved: {}\n", r.record_path);
}

int tune(const TuneArgs& ta) {
  const std::vector<Shape3> shapes = parse_shapes(ta.shapes);
  if (shapes.empty()) throw UserError("no shape to tune: give --shape MxNxK (one or more)");
  if (!ta.json.empty()) check_output_path(ta.json, "--json");
  const ParseOptions popts = ta.gemm.parse_options();
  CompileOptions opts;
  opts.gemm = ta.gemm.desc();
  opts.precise_math = ta.precise;
  opts.arch = arch_option(ta.arch);
  if (ta.max_candidates >= 0) opts.tune_max_candidates = ta.max_candidates;
  Kernel kernel(parse_expression_arg(ta.expr, popts), opts);

  // Every shape's candidates, compiled at once.
  std::vector<KernelConfig> all;
  for (const Shape3& s : shapes) {
    if (const std::string r = kernel.fallback_reason(s.m, s.n, s.k); !r.empty())
      throw UserError(fmt::format("{}x{}x{} cannot be fused, so there is nothing to tune: {}", s.m,
                                  s.n, s.k, r));
    for (const KernelConfig& c : kernel.tuning_candidates(s.m, s.n, s.k))
      if (std::find(all.begin(), all.end(), c) == all.end()) all.push_back(c);
  }
  if (ta.list) {  // the candidates alone: no compiling, no GPU
    for (const KernelConfig& c : all) fmt::print("{}\n", c.name());
    return kExitOk;
  }
  if (!have_gpu("tune", "candidates are timed on the GPU")) return kExitFailed;
  fmt::print("{} shape(s), {} distinct candidate configuration(s)\n", shapes.size(), all.size());
  const auto errors = kernel.compile_configs(all, progress_printer("evtc tune"));
  for (const auto& [name, e] : errors) fmt::print(stderr, "{} did not compile: {}\n", name, e.substr(0, 300));

  cudaStream_t stream;
  cudaStreamCreate(&stream);
  nlohmann::json report = nlohmann::json::array();
  for (const Shape3& s : shapes) {
    ReferenceInputs inputs = random_reference_inputs(kernel.graph(), s.m, s.n, s.k, opts.gemm.a_dtype,
                                                     opts.gemm.b_dtype, 1);
    if (opts.gemm.fp8_blockwise) add_random_block_scales(inputs, 1);
    runtime::DeviceProblem problem(kernel, inputs);
    const TuneResult r = kernel.tune(problem.arguments(), stream,
                                     progress_printer(fmt::format("evtc tune {}x{}x{}", s.m, s.n, s.k)));
    print_result(r);
    report.push_back(result_json(r));
  }
  cudaStreamDestroy(stream);
  if (!ta.json.empty()) write_output_file(ta.json, report.dump(2) + "\n", "--json");
  return kExitOk;
}

}  // namespace

Command add_tune_command(CLI::App& app) {
  auto ta = std::make_shared<TuneArgs>();
  CLI::App* sub = app.add_subcommand(
      "tune", "Autotune an epilogue's kernel configuration for problem shapes and persist the choices");
  sub->add_option("expr", ta->expr, "Expression, or a file holding one")->required();
  sub->add_option("--shape,-s", ta->shapes, "Problem shape MxNxK (repeat, or comma-separated)")
      ->delimiter(',')
      ->required();
  ta->gemm.add_to(sub);
  sub->add_flag("--precise", ta->precise, "Full-precision transcendental math");
  add_arch_option(sub, ta->arch);
  sub->add_option("--max-candidates", ta->max_candidates,
                  "Most candidates per shape (0: all that survive pruning; default 6)")
      ->check(count_value());
  sub->add_flag("--list-candidates", ta->list,
                "Print the shapes' candidate configurations after pruning, one per line, and stop");
  sub->add_option("--json", ta->json, "Write every shape's timings as JSON to this file");
  return {sub, [ta] { return tune(*ta); }};
}

}  // namespace evtc::cli
