// `evtc ref`: evaluates an epilogue with the fp64 reference interpreter on random inputs.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "cli.hpp"
#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/reference.hpp"

namespace evtc::cli {
namespace {

// The reference is an O(m·n·k) fp64 loop and keeps a few m×n fp64 arrays: past these sizes
// it would run for minutes or exhaust memory.
constexpr double kMaxMultiplyAdds = 0x1p34;
constexpr double kMaxElements = 0x1p28;

struct RefArgs {
  std::string expression;
  int64_t m = 0, n = 0, k = 0;
  uint64_t seed = 0;
  std::string dtype = "bf16";
  int show = 4;
  bool round_compute = false;
};

void check_problem_size(const RefArgs& a) {
  if (a.m <= 0 || a.n <= 0 || a.k <= 0)
    throw UserError(fmt::format("-m, -n and -k must be positive, got m={} n={} k={}", a.m, a.n, a.k));
  const double mn = static_cast<double>(a.m) * static_cast<double>(a.n);
  if (mn * static_cast<double>(a.k) > kMaxMultiplyAdds)
    throw UserError(fmt::format(
        "m*n*k = {}*{}*{} is too large for the CPU reference (at most 2^34 multiply-adds); "
        "choose smaller sizes",
        a.m, a.n, a.k));
  if (mn > kMaxElements)
    throw UserError(fmt::format(
        "m*n = {}*{} is too large for the CPU reference (at most 2^28 output elements); "
        "choose smaller sizes",
        a.m, a.n));
}

std::string shape_text(Shape s, int64_t m, int64_t n) {
  switch (s) {
    case Shape::full: return fmt::format("[m,n] = {}x{}", m, n);
    case Shape::half: return fmt::format("[m,n/2] = {}x{}", m, n / 2);
    case Shape::col: return fmt::format("[m] = {}", m);
    case Shape::row: return fmt::format("[n] = {}", n);
    case Shape::scalar: return "scalar";
  }
  return "?";
}

// A NaN prints as "nan" whatever its sign bit (log of a negative number gives -nan on x86).
std::string cell(double x) { return fmt::format(" {:>11.5g}", std::isnan(x) ? NAN : x); }

void print_values(const std::vector<double>& v, Shape shape, int64_t n, int show) {
  const auto shown = static_cast<int64_t>(show);
  if (shape == Shape::full || shape == Shape::half) {
    if (shape == Shape::half) n /= 2;
    const int64_t rows = std::min<int64_t>(shown, static_cast<int64_t>(v.size()) / n);
    for (int64_t i = 0; i < rows; ++i) {
      std::string line = " ";
      for (int64_t j = 0; j < std::min(shown, n); ++j) line += cell(v[i * n + j]);
      if (shown < n) line += " ...";
      fmt::print("{}\n", line);
    }
    if (rows < static_cast<int64_t>(v.size()) / n) fmt::print("  ...\n");
    return;
  }
  std::string line = " ";
  for (size_t i = 0; i < std::min(v.size(), static_cast<size_t>(shown)); ++i)
    line += cell(v[i]);
  if (static_cast<size_t>(shown) < v.size()) line += " ...";
  fmt::print("{}\n", line);
}

void print_summary(const std::vector<double>& v) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo, sum = 0.0;
  size_t finite = 0, nan = 0, inf = 0;
  for (double x : v) {
    if (std::isnan(x)) { ++nan; continue; }
    if (std::isinf(x)) { ++inf; continue; }
    lo = std::min(lo, x);
    hi = std::max(hi, x);
    sum += x;
    ++finite;
  }
  std::string line = finite == 0 ? "  no finite values"
                                 : fmt::format("  min {:.5g}  max {:.5g}  mean {:.5g}", lo, hi,
                                               sum / static_cast<double>(finite));
  if (nan > 0) line += fmt::format("  NaN {}", nan);
  if (inf > 0) line += fmt::format("  inf {}", inf);
  fmt::print("{}\n", line);
}

int run_ref(const RefArgs& a) {
  const std::optional<DType> ab_dtype = parse_dtype(a.dtype);  // dtype_value() has checked it
  check_problem_size(a);
  const Graph g = parse_expression_arg(a.expression);
  const ReferenceInputs inputs =
      random_reference_inputs(g, a.m, a.n, a.k, *ab_dtype, *ab_dtype, a.seed);
  ReferenceOptions options;
  options.round_compute = a.round_compute;
  const ReferenceOutputs outputs = evaluate_reference(g, inputs, options);

  fmt::print("m={} n={} k={}, A and B {}, seed {}{}\n", a.m, a.n, a.k, dtype_name(*ab_dtype),
             a.seed, a.round_compute ? ", compute rounded to its dtype" : "");
  for (NodeId id : g.outputs()) {
    const Node& store = g.node(id);
    const std::vector<double>& v = outputs.at(store.name);
    fmt::print("\n{}: {} {}\n", store.name, dtype_name(store.dtype),
               shape_text(store.shape, a.m, a.n));
    if (a.show > 0) print_values(v, store.shape, a.n, a.show);
    print_summary(v);
  }
  return kExitOk;
}

}  // namespace

Command add_ref_command(CLI::App& app) {
  auto args = std::make_shared<RefArgs>();
  CLI::App* sub = app.add_subcommand(
      "ref", "Evaluate an epilogue with the fp64 CPU reference on random inputs");
  sub->add_option("expression", args->expression, "An epilogue expression, or a file holding one")
      ->required();
  sub->add_option("-m", args->m, "Rows of the output")->required()->check(size_value());
  sub->add_option("-n", args->n, "Columns of the output")->required()->check(size_value());
  sub->add_option("-k", args->k, "Inner dimension of A@B")->required()->check(size_value());
  sub->add_option("--seed", args->seed, "Seed of the random inputs")->capture_default_str()->check(seed_value());
  sub->add_option("--dtype", args->dtype, "Element type of A and B")->capture_default_str()->check(dtype_value());
  sub->add_option("--show", args->show, "Show the top-left SHOW x SHOW values of each output")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  sub->add_flag("--round-compute", args->round_compute,
                "Round every compute result to its dtype (f32), as the device does");
  return {sub, [args] { return run_ref(*args); }};
}

}  // namespace evtc::cli
