// evtc run: random inputs on the GPU, the fused kernel, and optionally a check against the
// fp64 reference (--check) and timings against cuBLAS and the unfused path (--bench).
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/reference.hpp"
#include "evtc/runtime.hpp"
#include "testing/dispatch_timing.hpp"
#include "testing/harness.hpp"

namespace evtc::cli {
namespace {

struct RunArgs {
  std::string expr;
  int64_t m = 0, n = 0, k = 0;
  GemmFlags gemm;
  bool check = false, bench = false, precise = false, tune = false, integer_inputs = false;
  std::string config, arch, visit_order;
  std::string cast_mode = "eager";
  uint64_t seed = 1;
  std::string json;
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int run(const RunArgs& ra) {
  if (!ra.json.empty()) check_output_path(ra.json, "--json");
  const GemmDesc gemm = ra.gemm.desc();
  if (ra.integer_inputs && gemm.fp8_blockwise)
    throw UserError("--integer-inputs: not with --fp8-blockwise (block scales make the products non-integers)");
  const ExpressionArg expression = read_expression_arg(ra.expr);
  const Graph g = parse_expression(expression.text, ra.gemm.parse_options(), expression.name);
  if (!have_gpu("run", "use `evtc compile` to build the kernel without running it")) return kExitFailed;
  CompileOptions opts;
  opts.gemm = gemm;
  opts.precise_math = ra.precise;
  opts.arch = arch_option(ra.arch);
  opts.cast_mode = cast_mode_option(ra.cast_mode);
  if (!ra.config.empty()) opts.config = KernelConfig::parse(ra.config);  // config_value() has checked it
  if (!ra.visit_order.empty()) opts.visit_order = VisitOrder::parse(ra.visit_order);  // visit_order_value() checked it
  // The cost of a disk-cache hit in a new process is measured from here: the CUDA context
  // exists; building the Kernel, finding its compiled library and the first call are timed.
  cudaFree(nullptr);
  const auto t_construct = std::chrono::steady_clock::now();
  Kernel kernel(g, opts);
  const double construct_s = seconds_since(t_construct);
  nlohmann::json report;
  report["expression"] = expression.text;
  report["m"] = ra.m;
  report["n"] = ra.n;
  report["k"] = ra.k;
  report["dtype"] = dtype_name(gemm.a_dtype);
  report["dtype_b"] = dtype_name(gemm.b_dtype);
  report["layout_a"] = ra.gemm.layout_a;
  report["layout_b"] = ra.gemm.layout_b;
  report["fp8_fast_accum"] = gemm.fp8_fast_accum;
  report["fp8_blockwise"] = gemm.fp8_blockwise;

  const std::string reason = kernel.fallback_reason(ra.m, ra.n, ra.k);
  double compile_s = 0;
  if (reason.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    kernel.compile(ra.m, ra.n, ra.k);
    compile_s = seconds_since(t0);
    const ConfigChoice choice = kernel.config_choice(ra.m, ra.n, ra.k);
    fmt::print("compiled: {} ({}, {}, visiting order {}, {:.3f} s)\n", kernel.library_path(), choice.config.name(),
               choice.describe(), choice.order.name(), compile_s);
    report["compile_s"] = compile_s;
  } else {
    fmt::print("not fused: {}\n", reason);
  }

  cudaStream_t stream;
  cudaStreamCreate(&stream);
  ReferenceInputs inputs =
      ra.integer_inputs ? random_integer_inputs(kernel.graph(), ra.m, ra.n, ra.k, ra.seed)
                        : random_reference_inputs(kernel.graph(), ra.m, ra.n, ra.k, gemm.a_dtype, gemm.b_dtype, ra.seed);
  if (gemm.fp8_blockwise) add_random_block_scales(inputs, ra.seed);
  runtime::DeviceProblem problem(kernel, inputs);
  if (ra.tune) {
    if (!reason.empty()) throw UserError(fmt::format("--tune: this problem is not fused: {}", reason));
    const TuneResult r = kernel.tune(problem.arguments(), stream, progress_printer("evtc run --tune"));
    fmt::print("tuned: {}, visiting order {} ({:.4f} ms; {} candidates; saved in {})\n", r.best.name(),
               r.best_order.name(), r.best_ms, r.candidates.size(), r.record_path);
    report["tuned"] = {{"best", r.best.name()},
                       {"order", r.best_order.name()},
                       {"best_ms", r.best_ms},
                       {"candidates", r.candidates.size()}};
  }
  const ConfigChoice choice = kernel.config_choice(ra.m, ra.n, ra.k);
  report["config"] = choice.config.name();
  report["config_source"] = choice.describe();
  report["visit_order"] = choice.order.name();
  problem.poison_outputs(stream);
  cudaStreamSynchronize(stream);
  const auto t_first = std::chrono::steady_clock::now();
  const ExecutionPath path = kernel.run(problem.arguments(), stream);
  cudaStreamSynchronize(stream);
  const double first_call_s = seconds_since(t_first);
  if (!ra.tune && reason.empty())
    report["cache_hit_ms"] = 1000 * (construct_s + compile_s + first_call_s);
  const ReferenceOutputs got = problem.read_outputs(stream);
  fmt::print("ran: {} path, M={} N={} K={}\n", path == ExecutionPath::fused ? "fused" : "fallback",
             ra.m, ra.n, ra.k);
  report["path"] = path == ExecutionPath::fused ? "fused" : "fallback";

  int rc = kExitOk;
  if (ra.check) {
    const auto t0 = std::chrono::steady_clock::now();
    const runtime::Expected expected = runtime::expected_outputs(kernel, inputs, ra.integer_inputs);
    fmt::print("reference computed in {:.1f} s\n", seconds_since(t0));
    for (const auto& c : runtime::check_outputs(kernel, got, expected)) {
      fmt::print("check {}: {}\n", c.name, c.comparison.describe());
      report["check"][c.name] = {{"pass", c.comparison.pass},
                                 {"max_abs", c.comparison.max_abs},
                                 {"max_rel", c.comparison.max_rel},
                                 {"rel_l2", c.comparison.rel_l2},
                                 {"rounding_flips", c.comparison.rounding_flips}};
      if (!c.comparison.pass) rc = kExitFailed;
    }
    fmt::print("check: {}\n", rc == kExitOk ? "PASS" : "FAIL");
  }

  if (ra.bench) {
    const auto& args = problem.arguments();
    const double fused_ms = runtime::median_ms([&] { kernel.run(args, stream); }, stream);
    CompileOptions unfused_opts = opts;
    unfused_opts.disable_fusion = true;
    Kernel unfused(g, unfused_opts);
    const double unfused_ms = runtime::median_ms([&] { unfused.run(args, stream); }, stream);
    const DType d_dtype = kernel.signature().d_name.empty() ? DType::bf16 : kernel.signature().d_dtype;
    const double cublas_ms = runtime::cublas_gemm_ms(kernel, args, d_dtype, stream);
    const double tflops = 2.0 * ra.m * ra.n * ra.k / (fused_ms * 1e-3) / 1e12;
    fmt::print("bench: fused {:.4f} ms ({:.0f} TFLOP/s) | cuBLAS GEMM alone {:.4f} ms | unfused "
               "(cuBLASLt + epilogue) {:.4f} ms\n",
               fused_ms, tflops, cublas_ms, unfused_ms);
    fmt::print("bench: fused / cuBLAS = {:.3f}x, fused / unfused = {:.3f}x\n", fused_ms / cublas_ms,
               fused_ms / unfused_ms);
    report["bench"] = {{"fused_ms", fused_ms},        {"cublas_ms", cublas_ms},
                       {"unfused_ms", unfused_ms},    {"fused_over_cublas", fused_ms / cublas_ms},
                       {"fused_over_unfused", fused_ms / unfused_ms}, {"tflops", tflops}};
    if (path == ExecutionPath::fused) {
      const runtime::DispatchTimes t = runtime::measure_dispatch(kernel, args, stream);
      fmt::print("host dispatch per call: Kernel::run {:.2f} us (of which the kernel library's "
                 "evtc_run {:.2f} us; with new arguments every call {:.2f} us); cuBLASLt matmul "
                 "{:.2f} us\n",
                 t.run_us, t.library_us, t.library_new_args_us, t.cublas_us);
      report["dispatch"] = {{"run_us", t.run_us},
                            {"library_us", t.library_us},
                            {"library_new_args_us", t.library_new_args_us},
                            {"cublas_us", t.cublas_us}};
    }
  }
  cudaStreamDestroy(stream);
  if (!ra.json.empty()) write_output_file(ra.json, report.dump(2) + "\n", "--json");
  return rc;
}

}  // namespace

Command add_run_command(CLI::App& app) {
  auto ra = std::make_shared<RunArgs>();
  CLI::App* sub = app.add_subcommand("run", "Run an epilogue fused with a GEMM on random inputs");
  sub->add_option("expr", ra->expr, "Expression, or a file holding one")->required();
  sub->add_option("-m", ra->m, "M (rows of A and D)")->required()->check(size_value());
  sub->add_option("-n", ra->n, "N (columns of B and D)")->required()->check(size_value());
  sub->add_option("-k", ra->k, "K (columns of A, rows of B)")->required()->check(size_value());
  ra->gemm.add_to(sub);
  sub->add_flag("--check", ra->check,
                "Compare every output with the fp64 reference (bound: the dtype's tolerance plus each element's "
                "estimated amplification of the device's rounding)");
  sub->add_flag("--integer-inputs", ra->integer_inputs,
                "Inputs of small integers: with --check, elements the device computes exactly must match bit for bit");
  sub->add_flag("--bench", ra->bench, "Time fused vs plain cuBLAS vs unfused (median of 50)");
  sub->add_flag("--precise", ra->precise, "Full-precision transcendental math");
  add_arch_option(sub, ra->arch);
  sub->add_flag("--tune", ra->tune, "Autotune this shape first (compile and time the candidates)");
  sub->add_option("--config", ra->config, "Kernel config, e.g. coop_128x256x64_c2x1_persistent")->check(config_value());
  sub->add_option("--visit-order", ra->visit_order,
                  "The tile scheduler's visiting order, e.g. along_n_s8 (default: the configuration's measured "
                  "order, else CUTLASS's)")
      ->check(visit_order_value());
  add_cast_mode_option(sub, ra->cast_mode);
  sub->add_option("--seed", ra->seed, "Random seed for the inputs")->capture_default_str()->check(seed_value());
  sub->add_option("--json", ra->json, "Write the results as JSON to this file");
  return {sub, [ra] { return run(*ra); }};
}

}  // namespace evtc::cli
