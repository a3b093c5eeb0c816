// evtc grouped: a grouped (MoE) GEMM with a fused epilogue — compile it (no GPU needed), or
// run one problem on random inputs, check every group against the fp64 reference and time it.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <numeric>
#include <sstream>

#include "cli.hpp"
#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/grouped.hpp"
#include "testing/grouped_harness.hpp"

namespace evtc::cli {

namespace {

std::vector<int64_t> parse_rows(const std::string& text) {
  std::vector<int64_t> rows;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end || v < 0)
      throw UserError(fmt::format("--rows: '{}' is not a row count", item));
    rows.push_back(v);
  }
  return rows;
}

constexpr int64_t kMaxGroups = 1 << 16;

// Refuses (naming the sizes) a problem whose offsets overflow int32 or whose host buffers (the
// random inputs, the output read back and the fp64 reference) would not fit in this machine's
// memory, instead of failing in an allocation.
void check_problem_size(const std::vector<int64_t>& rows, int64_t n, int64_t k) {
  constexpr int64_t kLimit = int64_t(1) << 40;  // no size product below overflows int64
  int64_t total = 0;
  for (int64_t r : rows) {
    total += r;
    if (total >= (int64_t(1) << 31))
      throw UserError(fmt::format("the groups hold {} rows or more; the int32 group offsets hold at most {}",
                                  total, (int64_t(1) << 31) - 1));
  }
  if (n >= kLimit || k >= kLimit) throw UserError(fmt::format("-n {} / -k {}: sizes this large cannot run", n, k));
  const long double elements = (long double)total * k + (long double)rows.size() * n * k + 2.0L * total * n;
  const long double bytes = elements * 8;  // fp64 host copies, at most
  const long double memory = (long double)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGE_SIZE);
  if (bytes > memory)
    throw UserError(fmt::format("G={} total M={} N={} K={} needs about {:.0f} GiB of host memory for its inputs "
                                "and reference; this machine has {:.0f} GiB",
                                rows.size(), total, n, k, double(bytes / (1 << 30)), double(memory / (1 << 30))));
}

}  // namespace

Command add_grouped_command(CLI::App& app) {
  struct Args {
    std::string expr, config, emit, rows, weights = "nk", arch, dtype = "bf16";
    int64_t groups = 8, m = 0, n = 0, k = 0;
    bool compile_only = false, check = false, bench = false, precise = false, fp8_blockwise = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "grouped", "Grouped (MoE) GEMM with a fused epilogue: compile, or run/check/time one problem");
  sub->add_option("expr", a->expr, "Expression, or a file holding one")->required();
  sub->add_option("-g,--groups", a->groups, "Number of groups G")->check(size_value());
  sub->add_option("-m", a->m, "Rows per group (when --rows is not given)")->check(count_value());
  sub->add_option("--rows", a->rows, "Rows of each group, comma-separated (zeros allowed)");
  sub->add_option("-n", a->n, "N (output columns)")->check(size_value());
  sub->add_option("-k", a->k, "K")->check(size_value());
  sub->add_option("--weights", a->weights, "Weight layout: nk (G×N×K, K-major) or kn (G×K×N)")
      ->capture_default_str()
      ->check(CLI::IsMember({"nk", "kn"}));
  sub->add_option("--dtype", a->dtype, "x and weight dtype (" + or_list(tensor_core_input_names()) + ")")
      ->capture_default_str()
      ->check(dtype_value());
  sub->add_flag("--fp8-blockwise", a->fp8_blockwise,
                "fp8 x/weights with block scales (DeepSeek-V3's format): f32 scales per token row and 128 "
                "of K, and per 128x128 block of each group's weights");
  sub->add_option("--config", a->config, "Kernel config name")->check(config_value());
  sub->add_option("--emit", a->emit, "Write the generated CUDA source to this file");
  sub->add_flag("--compile-only", a->compile_only, "Compile the kernel and print its path (no GPU needed)");
  sub->add_flag("--check", a->check, "Compare every group with the fp64 reference");
  sub->add_flag("--bench", a->bench, "Time the grouped kernel (median of CUDA-event timings)");
  sub->add_flag("--precise", a->precise, "Full-precision transcendental math");
  add_arch_option(sub, a->arch);
  return {sub, [a] {
            GroupedOptions opts;
            opts.arch = arch_option(a->arch);
            opts.gemm.b_layout = a->weights == "nk" ? Layout::col_major : Layout::row_major;
            opts.precise_math = a->precise;
            // dtype_value() has checked the dtype.
            opts.gemm.a_dtype = opts.gemm.b_dtype = parse_dtype(a->dtype).value_or(DType::bf16);
            opts.gemm.fp8_blockwise = a->fp8_blockwise;
            if (std::string why = fp8_blockwise_refusal(opts.gemm); !why.empty())
              throw UserError("--fp8-blockwise: " + why);
            if (!a->config.empty()) opts.config = KernelConfig::parse(a->config);  // config_value() checked it
            // Undeclared operands and outputs: x's dtype, or for fp8 f32 operands and bf16 outputs.
            ParseOptions popts;
            popts.operand_dtype = is_fp8(opts.gemm.a_dtype) ? DType::f32 : opts.gemm.a_dtype;
            popts.output_dtype = is_fp8(opts.gemm.a_dtype) ? DType::bf16 : opts.gemm.a_dtype;
            GroupedKernel kernel(parse_expression_arg(a->expr, popts), opts);
            // A problem to run is checked before anything is compiled or allocated.
            std::vector<int64_t> rows;
            if (!a->compile_only) {
              if (a->n <= 0 || a->k <= 0) throw UserError("-n and -k are needed to run a grouped problem");
              if (a->rows.empty() && (a->groups < 1 || a->groups > kMaxGroups))
                throw UserError(fmt::format("-g: {} groups; expected 1 to {}", a->groups, kMaxGroups));
              if (a->rows.empty() && a->m < 0) throw UserError(fmt::format("-m: {} rows is negative", a->m));
              rows = a->rows.empty() ? std::vector<int64_t>(size_t(a->groups), a->m) : parse_rows(a->rows);
              check_problem_size(rows, a->n, a->k);
              if (!have_gpu("grouped", "--compile-only builds the kernel without running it")) return kExitFailed;
            }
            if (!a->emit.empty()) {
              write_output_file(a->emit, kernel.source(), "--emit");
              fmt::print("wrote {}\n", a->emit);
            }
            auto t0 = std::chrono::steady_clock::now();
            const std::string path = kernel.compile();
            fmt::print("grouped kernel: {} ({}, {:.3f} s)\n", path, kernel.config().name(),
                       std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            if (a->compile_only) return kExitOk;
            const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t(0));
            auto inputs = runtime::random_grouped_inputs(kernel, rows, a->n, a->k, 1);
            runtime::GroupedDeviceProblem problem(kernel, inputs, total);
            problem.poison_output(nullptr);
            kernel.run(problem.arguments(), nullptr);
            fmt::print("ran: G={} total M={} N={} K={}\n", rows.size(), total, a->n, a->k);
            int rc = kExitOk;
            if (a->check) {
              const auto got = problem.read_output(total, nullptr);
              const auto cmp = runtime::check_grouped_output(kernel, got,
                                                             evaluate_grouped_reference(kernel.graph(), inputs));
              fmt::print("check {}: {}\n", kernel.output_name(), cmp.describe());
              if (!cmp.pass) rc = kExitFailed;
            }
            if (a->bench) {
              const double ms = runtime::median_ms([&] { kernel.run(problem.arguments(), nullptr); }, nullptr);
              const double flops = 2.0 * double(total) * double(a->n) * double(a->k);
              fmt::print("bench: grouped {:.4f} ms ({:.0f} TFLOP/s)\n", ms, flops / ms / 1e9);
            }
            return rc;
          }};
}

}  // namespace evtc::cli
